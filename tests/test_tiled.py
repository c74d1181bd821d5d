"""Tests for attention/efficient/tiled.py: the online softmax and tiled attention equal
the dense reference."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import (
    online_softmax,
    scaled_dot_product_attention,
    softmax,
    tiled_attention,
)
from attention.efficient.tiled import flash_tile_kinds
from conftest import qkv

F64 = torch.float64


def grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


# ----------------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_online_softmax_equals_softmax(block_size, dim):
    x = 5 * torch.randn(6, 11, dtype=F64)
    torch.testing.assert_close(
        online_softmax(x, dim, block_size=block_size), softmax(x, dim)
    )
    torch.testing.assert_close(
        online_softmax(x, dim, block_size=block_size), torch.softmax(x, dim)
    )


def test_online_softmax_in_blocks_equals_softmax():
    x = torch.randn(3, 4, 130, dtype=F64)
    torch.testing.assert_close(online_softmax(x, block_size=16), softmax(x))


def test_online_softmax_large_and_increasing_inputs():
    # Every element raises the running max: each step rescales; no overflow at 1000.
    x = torch.arange(0, 1001, 10, dtype=F64)
    out = online_softmax(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_online_softmax_minus_inf():
    x = torch.tensor(
        [[float("-inf"), 1.0, float("-inf"), 2.0], [float("-inf")] * 4], dtype=F64
    )
    out = online_softmax(x, block_size=1)
    torch.testing.assert_close(out[0], torch.softmax(x[0], -1))
    assert out[0, 0] == 0 and out[0, 2] == 0
    assert torch.isnan(out[1]).all()  # as softmax and torch.softmax


def test_online_softmax_gradient():
    x = torch.randn(3, 9, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: online_softmax(t, block_size=4), (x,))


@given(n=st.integers(1, 40), block=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_property_online_softmax(n, block, seed):
    g = torch.Generator().manual_seed(seed)
    x = 10 * torch.randn(2, n, generator=g, dtype=F64)
    torch.testing.assert_close(
        online_softmax(x, block_size=block), torch.softmax(x, -1)
    )


def test_online_softmax_rejects_bad_block_size():
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        online_softmax(torch.zeros(3), block_size=0)


# ------------------------------------------------------------------- tiled == reference

LENGTHS = [1, 2, 37, 64, 130]
BLOCKS = [1, 7, 16, 64]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_equals_reference_outputs_and_gradients(n, block_size, is_causal):
    q, k, v = qkv(n, grad=True)
    fast = tiled_attention(q, k, v, block_size=block_size, is_causal=is_causal)
    ref = scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(fast, ref)
    for a, b in zip(grads(fast, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("i, j", [(5, 3), (3, 9), (10, 1), (1, 10), (37, 130)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_queries_and_keys_of_different_lengths(i, j, is_causal):
    q, k, v = qkv(i, j, grad=True)
    fast = tiled_attention(q, k, v, block_size=4, is_causal=is_causal)
    ref = scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(fast, ref)
    for a, b in zip(grads(fast, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_equals_torch_sdpa(is_causal):
    q, k, v = qkv(45, batch=(2, 4))
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=16, is_causal=is_causal),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
    )


def test_scale():
    q, k, v = qkv(20)
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=6, scale=0.7),
        scaled_dot_product_attention(q, k, v, scale=0.7),
    )


def test_broadcast_batch_dims_and_unbatched():
    q, _, _ = qkv(11, batch=(2, 3))
    _, k, v = qkv(11, batch=(1, 3), seed=4)
    out = tiled_attention(q, k, v, block_size=4, is_causal=True)
    assert out.shape == (2, 3, 11, 5)
    torch.testing.assert_close(
        out, scaled_dot_product_attention(q, k, v, is_causal=True)
    )
    q, k, _ = qkv(11, batch=(1, 3), grad=True)
    _, _, v = qkv(
        11, batch=(2, 3), seed=5, grad=True
    )  # only the values carry the batch
    out = tiled_attention(q, k, v, block_size=4, is_causal=True)
    ref = scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)
    q, k, v = qkv(9, batch=())
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=2), scaled_dot_product_attention(q, k, v)
    )


def test_float32_close_to_float64():
    q, k, v = qkv(200)
    out = tiled_attention(
        q.float(), k.float(), v.float(), block_size=32, is_causal=True
    )
    ref = scaled_dot_product_attention(q, k, v, is_causal=True).float()
    torch.testing.assert_close(out, ref)


def test_large_scores_do_not_overflow():
    q, k, v = qkv(30)
    out = tiled_attention(100 * q, 100 * k, v, block_size=7)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, scaled_dot_product_attention(100 * q, 100 * k, v))


@given(
    i=st.integers(1, 30),
    j=st.integers(1, 30),
    block_size=st.integers(1, 12),
    is_causal=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_property_tiled_equals_reference(i, j, block_size, is_causal, seed):
    q, k, v = qkv(i, j, d=3, e=2, batch=(2,), seed=seed)
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=block_size, is_causal=is_causal),
        scaled_dot_product_attention(q, k, v, is_causal=is_causal),
    )


# -------------------------------------------------------------------------- log-sum-exp


@pytest.mark.parametrize("is_causal", [False, True])
def test_return_lse(is_causal):
    q, k, v = qkv(37, grad=True)
    out, lse = tiled_attention(
        q, k, v, block_size=7, is_causal=is_causal, return_lse=True
    )
    scores = q @ k.transpose(-2, -1) / 8**0.5
    if is_causal:
        scores = scores.masked_fill(
            torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf")
        )
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(
        out, scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    )
    # The log-sum-exp is differentiable too.
    ga = torch.autograd.grad(lse.sum(), (q, k))
    gb = torch.autograd.grad(torch.logsumexp(scores, -1).sum(), (q, k))
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- masks


def test_boolean_mask_equals_reference():
    q, k, v = qkv(23, 31, grad=True)
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(2, 1, 23, 31, generator=g) > 0.3  # True = may attend
    fast = tiled_attention(q, k, v, block_size=8, attn_mask=mask)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(fast, ref)
    for a, b in zip(grads(fast, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_float_mask_equals_reference():
    q, k, v = qkv(17, 12)
    bias = torch.randn(17, 12, dtype=F64)
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=5, attn_mask=bias),
        scaled_dot_product_attention(q, k, v, attn_mask=bias),
    )


def test_padding_mask_broadcast_over_queries():
    q, k, v = qkv(9, 14)
    mask = torch.arange(14) < 10  # (j,): the last 4 keys are padding
    torch.testing.assert_close(
        tiled_attention(q, k, v, block_size=3, attn_mask=mask),
        scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


@pytest.mark.parametrize("block_size", [1, 4, 64])
def test_fully_masked_rows_give_zero_output_and_finite_gradients(block_size):
    q, k, v = qkv(10, 13, grad=True)
    mask = torch.ones(10, 13, dtype=torch.bool)
    mask[3] = False
    mask[7, :] = False
    fast, lse = tiled_attention(
        q, k, v, block_size=block_size, attn_mask=mask, return_lse=True
    )
    ref = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(fast, ref)
    assert (fast[..., 3, :] == 0).all() and (fast[..., 7, :] == 0).all()
    assert torch.isneginf(lse[..., 3]).all()
    ga, gb = grads(fast, (q, k, v)), grads(ref, (q, k, v))
    for a, b in zip(ga, gb, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def test_no_keys_gives_zero_output():
    q, k, v = qkv(4, 0)
    out = tiled_attention(q, k, v)
    torch.testing.assert_close(out, torch.zeros(2, 3, 4, 5, dtype=F64))


@pytest.mark.parametrize("block_size", [1, 7, 64])
def test_causal_future_poisoned_with_huge_values_changes_nothing(block_size):
    n, cut = 50, 29
    q, k, v = qkv(n)
    ref = tiled_attention(q, k, v, block_size=block_size, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., cut:, :] = 1e9
    v2[..., cut:, :] = 1e9
    out = tiled_attention(q, k2, v2, block_size=block_size, is_causal=True)
    torch.testing.assert_close(out[..., :cut, :], ref[..., :cut, :])


def test_masked_keys_poisoned_with_huge_values_change_nothing():
    q, k, v = qkv(12, 20)
    mask = torch.arange(20) < 15
    ref = tiled_attention(q, k, v, block_size=6, attn_mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[..., 15:, :] = 1e9
    v2[..., 15:, :] = 1e9
    torch.testing.assert_close(
        tiled_attention(q, k2, v2, block_size=6, attn_mask=mask), ref
    )


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("block_size", [0, -1])
def test_rejects_non_positive_block_size(block_size):
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match=f"block_size must be >= 1, got {block_size}"):
        tiled_attention(q, k, v, block_size=block_size)


def test_rejects_non_integer_block_size():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        tiled_attention(q, k, v, block_size=4.0)


def test_rejects_mismatched_d():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 8 and 6"
    ):
        tiled_attention(q, k[..., :6], v)


def test_rejects_mismatched_positions():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError,
        match="key and value must have the same number of positions j, got 4 and 2",
    ):
        tiled_attention(q, k, v[..., :2, :])


def test_rejects_batch_dims_that_do_not_broadcast():
    q, k, v = qkv(4, batch=(2,))
    with pytest.raises(
        ValueError, match="batch dims of query, key and value must broadcast"
    ):
        tiled_attention(q, k, torch.zeros(3, 4, 5, dtype=F64))


def test_rejects_mixed_dtypes_and_non_tensors():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="query and value must share a dtype"):
        tiled_attention(q, k, v.float())
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got list"):
        tiled_attention([1.0], k, v)


def test_rejects_mask_together_with_is_causal_and_bad_masks():
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match="pass either attn_mask or is_causal=True"):
        tiled_attention(
            q, k, v, is_causal=True, attn_mask=torch.ones(4, 4, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="does not broadcast"):
        tiled_attention(q, k, v, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="is_causal must be a bool.*got int"):
        tiled_attention(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match="scale must be a float or None, got str"):
        tiled_attention(q, k, v, scale="1")


def test_rejects_bad_flags_and_mixed_devices():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="enable_gqa must be a bool.*got str"):
        tiled_attention(q, k, v, enable_gqa="no")
    with pytest.raises(TypeError, match="return_lse must be a bool.*got int"):
        tiled_attention(q, k, v, return_lse=1)
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        tiled_attention(q, k, v, scale=True)
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        tiled_attention(q, k.to("meta"), v)
    with pytest.raises(
        ValueError, match="query heads must be a multiple of the key/value heads"
    ):
        tiled_attention(q, k[:, :2], v[:, :2], enable_gqa=True)


def test_options_are_keyword_only():
    q, k, v = qkv(4)
    with pytest.raises(TypeError):
        tiled_attention(q, k, v, None)


# ------------------------------------------------------------- the recomputing backward


@pytest.mark.slow  # a large gradcheck: make test, not make check
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "i, j, block_size",
    [
        (10, 6, 4),
        # more blocks and ragged edges: about a second of CPU each, for make test
        pytest.param(11, 11, 4, marks=pytest.mark.slow),
        pytest.param(7, 10, 3, marks=pytest.mark.slow),
    ],
)
def test_gradcheck(is_causal, i, j, block_size):
    q, k, v = qkv(i, j, d=4, e=3, batch=(2,), grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: tiled_attention(
            q, k, v, block_size=block_size, is_causal=is_causal, return_lse=True
        ),
        (q, k, v),
    )


def test_gradcheck_masks_scale_broadcast_and_gqa():
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(9, 10, d=3, e=2, batch=(2, 2), grad=True)
    mask = torch.rand(2, 9, 10, generator=g) > 0.4
    mask[1, 2] = False  # a query with no visible key
    bias = torch.randn(1, 9, 10, generator=g, dtype=F64)
    check = lambda fn, *inputs: torch.autograd.gradcheck(fn, inputs, fast_mode=True)
    for kwargs in ({"attn_mask": mask}, {"attn_mask": bias, "scale": 0.4}):
        assert check(
            lambda q, k, v, kw=kwargs: tiled_attention(q, k, v, block_size=3, **kw),
            q,
            k,
            v,
        )
    k1, v1 = (
        t.detach()[:1].clone().requires_grad_() for t in (k, v)
    )  # batch dims broadcast
    assert check(
        lambda q, k, v: tiled_attention(q, k, v, block_size=4, is_causal=True),
        q,
        k1,
        v1,
    )
    kg, vg = (
        t.detach()[:, :1].clone().requires_grad_() for t in (k, v)
    )  # 2 query heads, 1 kv head
    assert check(
        lambda q, k, v: tiled_attention(
            q, k, v, block_size=4, enable_gqa=True, attn_mask=mask
        ),
        q,
        kg,
        vg,
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_equal_torch_sdpa_at_1000_in_float32(is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 1000, 32, generator=g).requires_grad_() for _ in range(3)
    )
    weight = torch.randn(1, 2, 1000, 32, generator=g)
    out = tiled_attention(q, k, v, block_size=128, is_causal=is_causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref)
    for a, b in zip(
        torch.autograd.grad((out * weight).sum(), (q, k, v)),
        torch.autograd.grad((ref * weight).sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


def test_gqa_equals_torch_with_gradients():
    q, _, _ = qkv(12, batch=(2, 6), grad=True)
    _, k, v = qkv(12, batch=(2, 2), seed=1, grad=True)
    mask = torch.rand(6, 12, 12, generator=torch.Generator().manual_seed(2)) > 0.3
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask[:1]}):
        out = tiled_attention(q, k, v, block_size=5, enable_gqa=True, **kwargs)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, enable_gqa=True, **kwargs
        )
        torch.testing.assert_close(out, ref)
        for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
            torch.testing.assert_close(a, b)


def _count_saved(fn):
    """Tensors autograd saves while ``fn()`` runs, as a list of shapes."""
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def test_only_qkv_output_and_lse_are_saved():
    q, k, v = qkv(40, 30, grad=True)  # (2, 3, 40, 8), (2, 3, 30, 8), (2, 3, 30, 5)
    out, saved = _count_saved(
        lambda: tiled_attention(q, k, v, block_size=8, is_causal=True)
    )
    assert saved == [
        (2, 3, 40, 8),
        (2, 3, 30, 8),
        (2, 3, 30, 5),
        (2, 3, 40, 5),
        (2, 3, 40),
    ]
    assert len(out.grad_fn.saved_tensors) == 5
    mask = torch.arange(30) < 20
    _, saved = _count_saved(
        lambda: tiled_attention(q, k, v, block_size=8, attn_mask=mask)
    )
    assert (
        saved[-1] == (1, 30) and len(saved) == 6
    )  # and the mask, a view, not expanded
    # plain autograd through the same tiles would keep every tile: far more numbers
    _, naive = _count_saved(lambda: scaled_dot_product_attention(q, k, v))
    assert sum(torch.Size(s).numel() for s in naive) > 40 * 30 * 6


def test_query_with_no_visible_key_gets_zero_gradient_and_float_mask_none():
    q, k, v = qkv(6, 8, grad=True)
    mask = torch.ones(6, 8, dtype=torch.bool)
    mask[2] = False
    out, lse = tiled_attention(q, k, v, block_size=3, attn_mask=mask, return_lse=True)
    (dq,) = torch.autograd.grad((out.sum() + lse[..., [0, 1, 3, 4, 5]].sum()), (q,))
    assert (dq[..., 2, :] == 0).all() and (
        out[..., 2, :] == 0
    ).all()  # exact: the tile weights are 0
    bias = torch.randn(6, 8, dtype=F64, requires_grad=True)
    tiled_attention(q, k, v, attn_mask=bias).sum().backward()
    assert bias.grad is None and q.grad is not None


def test_gradient_through_lse_only():
    q, k, v = qkv(15, 9, grad=True)
    _, lse = tiled_attention(q, k, v, block_size=4, return_lse=True)
    scores = q @ k.transpose(-2, -1) / 8**0.5
    ga = torch.autograd.grad(lse.sum(), (q, k, v), allow_unused=True)
    gb = torch.autograd.grad(torch.logsumexp(scores, -1).sum(), (q, k))
    torch.testing.assert_close(ga[0], gb[0])
    torch.testing.assert_close(ga[1], gb[1])
    assert (ga[2] == 0).all()  # the lse does not depend on the values


# ------------------------------------------------------------------ edge input as torch


def test_nan_propagates_as_in_torch():
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = qkv(6, 7)
    k2 = k.clone()
    k2[0, 1, 4, 2] = float("nan")  # one key of one head of one batch entry
    out = tiled_attention(q, k2, v, block_size=3)
    torch.testing.assert_close(out, sdpa(q, k2, v), equal_nan=True)
    assert (
        out[0, 1].isnan().all()
        and not out[1].isnan().any()
        and not out[0, 0].isnan().any()
    )
    # causally too, as in torch: the hidden future score is still a NaN score, so every
    # query of that head is NaN (the package's one rule for non-finite scores)
    out = tiled_attention(q, k2, v, block_size=3, is_causal=True)
    torch.testing.assert_close(out, sdpa(q, k2, v, is_causal=True), equal_nan=True)
    assert out[0, 1].isnan().all() and not out[0, 0].isnan().any()
    # a NaN scale reaches every row, masked or not
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[3] = False
    nan_scale = tiled_attention(q, k, v, scale=float("nan"), attn_mask=mask)
    assert (
        nan_scale.isnan().all()
        and sdpa(q, k, v, scale=float("nan"), attn_mask=mask).isnan().all()
    )
    # a NaN in a float mask makes its row NaN
    bias = torch.zeros(6, 7, dtype=F64)
    bias[1, 5] = float("nan")
    torch.testing.assert_close(
        tiled_attention(q, k, v, attn_mask=bias),
        sdpa(q, k, v, attn_mask=bias),
        equal_nan=True,
    )


def test_overflowed_rows_are_nan_as_in_torch():
    q, k, v = (t.float() for t in qkv(5, 6))
    q[0, 0, 2] = 1e30
    k[0, 0, 1] = 1e10  # the score of query 2 and key 1 overflows float32 to +inf
    out = tiled_attention(q, k, v, block_size=2)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out[0, 0, 2].isnan().all() and ref[0, 0, 2].isnan().all()
    torch.testing.assert_close(out, ref, equal_nan=True)


@pytest.mark.parametrize(
    "i, j, d, e", [(0, 5, 4, 3), (4, 0, 4, 3), (4, 5, 0, 3), (4, 5, 4, 0), (0, 0, 0, 0)]
)
def test_empty_axes_as_in_torch(i, j, d, e):
    q, k, v = qkv(i, j, d=d, e=e, grad=True)
    for is_causal in (False, True):
        out = tiled_attention(q, k, v, block_size=2, is_causal=is_causal)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal
        )
        torch.testing.assert_close(out, ref)
        if out.numel():
            for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
                torch.testing.assert_close(a, b)


def test_d_zero_ignores_the_scale_as_torch():
    q, k, v = qkv(3, 4, d=0)
    for scale in (None, float("nan"), 5.0):
        torch.testing.assert_close(
            tiled_attention(q, k, v, scale=scale),
            torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale),
        )


def test_huge_block_size_is_clamped():
    q, k, v = qkv(5, 7, grad=True)
    out = tiled_attention(q, k, v, block_size=10**15, is_causal=True)
    torch.testing.assert_close(
        out, scaled_dot_product_attention(q, k, v, is_causal=True)
    )
    grads(out, (q, k, v))


def test_online_softmax_nan_and_inf_as_torch():
    x = torch.tensor(
        [[float("inf"), 1.0, 2.0], [float("nan"), 0.0, 1.0], [0.0, 1.0, 2.0]], dtype=F64
    )
    for block_size in (1, 2, 3):
        torch.testing.assert_close(
            online_softmax(x, block_size=block_size),
            torch.softmax(x, -1),
            equal_nan=True,
        )
    assert online_softmax(x[:, :0]).shape == (3, 0)


@pytest.mark.parametrize(
    "shape", [(6, 1), (1, 1), (2, 4, 1, 1), (1, 7), (4, 6, 1), (2, 1, 6, 1)], ids=str
)
@pytest.mark.parametrize("gqa", [False, True])
def test_masks_broadcasting_over_the_key_axis_with_the_lse_and_backward(shape, gqa):
    """j = 7 is not a multiple of block_size = 3: a key axis of size 1 must broadcast to
    every block, not be sliced to nothing."""
    q, k, v = qkv(6, 7, batch=(2,), h=4, h_kv=2 if gqa else 4, grad=True)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.3
    out, lse = tiled_attention(
        q, k, v, attn_mask=mask, block_size=3, return_lse=True, enable_gqa=gqa
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=gqa
    )
    torch.testing.assert_close(out, ref)
    kk = k.repeat_interleave(2, dim=-3) if gqa else k
    scores = (q @ kk.transpose(-2, -1) / 8**0.5).masked_fill(~mask, -torch.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------- the schedule


def _kinds_by_pairs(i, j, block, is_causal):
    """flash_tile_kinds from its definition, pair by pair. The kernel reasons about
    whole blocks (a program's rows and a key block's keys run to the end of their
    block, past i or j): a tile is skipped when no row sees any key, unmasked when
    every row sees every key, masked otherwise."""
    rows_of = lambda m: range(m * block, (m + 1) * block)
    keys_of = lambda n: range(n * block, (n + 1) * block)
    kinds = torch.zeros(-(-i // block), -(-j // block), dtype=torch.long)
    for m in range(kinds.shape[0]):
        for n in range(kinds.shape[1]):
            seen = [q >= k or not is_causal for q in rows_of(m) for k in keys_of(n)]
            kinds[m, n] = 1 if all(seen) else 2 if any(seen) else 0
    return kinds


@pytest.mark.parametrize(
    "i, j, block", [(40, 40, 16), (70, 45, 16), (45, 70, 16), (7, 7, 3), (33, 64, 8)]
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_tile_kinds_follow_the_definition(i, j, block, is_causal):
    got = flash_tile_kinds(i, j, block, is_causal=is_causal)
    assert torch.equal(got, _kinds_by_pairs(i, j, block, is_causal))


def test_flash_tile_kinds_count_the_causal_triangle():
    t = 8
    kinds = flash_tile_kinds(t * 64, t * 64, 64, is_causal=True)
    assert (kinds > 0).sum() == t * (t + 1) // 2 and (kinds == 2).sum() == t
    assert torch.equal(kinds == 2, torch.eye(t, dtype=torch.bool))


def test_flash_tile_kinds_of_empty_sequences_and_bad_arguments():
    assert flash_tile_kinds(0, 5, 4).shape == (0, 2)
    assert flash_tile_kinds(5, 0, 4, is_causal=True).shape == (2, 0)
    with pytest.raises(ValueError, match="block_size"):
        flash_tile_kinds(5, 5, 0)
    with pytest.raises(TypeError, match="num_keys"):
        flash_tile_kinds(5, 5.0, 4)
    with pytest.raises(TypeError, match="is_causal"):
        flash_tile_kinds(5, 5, 4, is_causal=1)
