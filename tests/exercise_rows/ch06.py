"""Chapter 6's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch06
from exercise_rows import Row

# -------------------------------------------------------------------- split heads


def my_split_heads(x, num_heads):
    """(b, L, h*d) -> (b, h, L, d): head n owns features n*d ... n*d + d - 1."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).transpose(1, 2)


def my_split_heads_stub(x, num_heads):
    """(b, L, h*d) -> (b, h, L, d): head n owns features n*d ... n*d + d - 1."""
    raise NotImplementedError("write your solution here")


def split_by_view_only(x, num_heads):
    b, length, features = x.shape
    return x.view(b, num_heads, length, features // num_heads)


def split_every_hth_feature(x, num_heads):
    b, length, features = x.shape
    d = features // num_heads
    return x.view(b, length, d, num_heads).permute(0, 3, 1, 2)


def split_without_the_transpose(x, num_heads):
    b, length, features = x.shape
    return x.view(b, length, num_heads, features // num_heads)


# -------------------------------------------------------------------- merge heads


def my_merge_heads(x):
    """(b, h, L, d) -> (b, L, h*d): the heads concatenated, token by token."""
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, h * d)


def my_merge_heads_stub(x):
    """(b, h, L, d) -> (b, L, h*d): the heads concatenated, token by token."""
    raise NotImplementedError("write your solution here")


def merge_without_the_transpose(x):
    b, h, length, d = x.shape
    return x.reshape(b, length, h * d)


def merge_in_the_wrong_order(x):
    b, h, length, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, length, h * d)


def merge_with_view(x):
    b, h, length, d = x.shape
    return x.transpose(1, 2).view(b, length, h * d)


# ---------------------------------------------------------------------- repeat_kv


def my_repeat_kv(x, n_rep):
    """(b, h_kv, L, d) -> (b, h_kv * n_rep, L, d): each key/value head n_rep times."""
    b, h_kv, length, d = x.shape
    x = x[:, :, None].expand(b, h_kv, n_rep, length, d)
    return x.reshape(b, h_kv * n_rep, length, d)


def my_repeat_kv_stub(x, n_rep):
    """(b, h_kv, L, d) -> (b, h_kv * n_rep, L, d): each key/value head n_rep times."""
    raise NotImplementedError("write your solution here")


def repeat_kv_tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


def repeat_kv_on_the_tokens(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=2)


def repeat_kv_tiled_by_cat(x, n_rep):
    return torch.cat([x] * n_rep, dim=1)


# ---------------------------------------------------------------- causal multi-head


def my_causal_multi_head(x, w_q, w_k, w_v, w_o, num_heads):
    """Causal multi-head self-attention: split, attend per head, merge, project."""
    b, length, _ = x.shape

    def split(t):  # (b, L, h*d) -> (b, h, L, d)
        return t.reshape(b, length, num_heads, -1).transpose(1, 2)

    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.ones(length, length, dtype=torch.bool).tril()  # True = may attend
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    z = (weights @ v).transpose(1, 2).reshape(b, length, -1)  # (b, L, h*d)
    return z @ w_o


def my_causal_multi_head_stub(x, w_q, w_k, w_v, w_o, num_heads):
    """Causal multi-head self-attention: split, attend per head, merge, project."""
    raise NotImplementedError("write your solution here")


def _layer(x, w_q, w_k, w_v, w_o, h, *, scale=None, split=None, merge=None, keep=True):
    b, length, d_model = x.shape

    def split_right(t):
        return t.reshape(b, length, h, -1).transpose(1, 2)

    q, k, v = ((split or split_right)(x @ w) for w in (w_q, w_k, w_v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale(q, x)
    scores = q @ k.transpose(-2, -1) * scale
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    if keep == "inverted":
        mask = ~mask
    if keep:
        scores = scores.masked_fill(~mask, float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v
    merged = (
        merge(z) if merge else z.transpose(1, 2).reshape(b, length, -1)
    )  # (b, L, h*d)
    return merged @ w_o


def mha_scaled_by_d_model(x, w_q, w_k, w_v, w_o, num_heads):
    return _layer(
        x, w_q, w_k, w_v, w_o, num_heads, scale=lambda q, x: 1 / math.sqrt(x.shape[-1])
    )


def mha_split_without_transpose(x, w_q, w_k, w_v, w_o, num_heads):
    b, length, _ = x.shape
    return _layer(
        x,
        w_q,
        w_k,
        w_v,
        w_o,
        num_heads,
        split=lambda t: t.reshape(b, num_heads, length, -1),
    )


def mha_with_the_mask_inverted(x, w_q, w_k, w_v, w_o, num_heads):
    return _layer(x, w_q, w_k, w_v, w_o, num_heads, keep="inverted")


def mha_without_a_mask(x, w_q, w_k, w_v, w_o, num_heads):
    return _layer(x, w_q, w_k, w_v, w_o, num_heads, keep=False)


def mha_merged_in_the_wrong_order(x, w_q, w_k, w_v, w_o, num_heads):
    b, length, _ = x.shape
    return _layer(
        x,
        w_q,
        w_k,
        w_v,
        w_o,
        num_heads,
        merge=lambda z: z.permute(0, 2, 3, 1).reshape(b, length, -1),
    )


ROWS = [
    Row(
        ch06.check_split_heads,
        my_split_heads,
        my_split_heads_stub,
        (
            (split_by_view_only, "a head gets features of several tokens"),
            (split_every_hth_feature, "head n gets every h-th feature"),
            (split_without_the_transpose, "transpose(1, 2) gives (b, h, L, d)"),
        ),
    ),
    Row(
        ch06.check_merge_heads,
        my_merge_heads,
        my_merge_heads_stub,
        (
            (merge_without_the_transpose, "reshaped without the transpose"),
            (merge_in_the_wrong_order, "merged in the wrong order"),
            (merge_with_view, "use reshape"),
        ),
    ),
    Row(
        ch06.check_repeat_kv,
        my_repeat_kv,
        my_repeat_kv_stub,
        (
            (repeat_kv_tiled, "are tiled"),
            (repeat_kv_tiled_by_cat, "are tiled"),
            (repeat_kv_on_the_tokens, "the wrong axis"),
        ),
    ),
    Row(
        ch06.check_causal_multi_head,
        my_causal_multi_head,
        my_causal_multi_head_stub,
        (
            (mha_scaled_by_d_model, "divided by sqrt(d_model)"),
            (mha_split_without_transpose, "the split mixes tokens"),
            (mha_with_the_mask_inverted, "the mask looks inverted"),
            (mha_without_a_mask, "no causal mask"),
            (mha_merged_in_the_wrong_order, "merged in the wrong order"),
        ),
    ),
]
