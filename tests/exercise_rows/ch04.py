"""Chapter 4's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch

from attention.exercises import ch04
from exercise_rows import Row


def my_causal_mask(length):
    """The (length, length) causal mask, True where key j <= query i."""
    positions = torch.arange(length)
    return positions[None, :] <= positions[:, None]  # (query i, key j)


def my_causal_mask_stub(length):
    """The (length, length) causal mask, True where key j <= query i."""
    raise NotImplementedError("write your solution here")


def causal_mask_true_on_the_future(length):
    return torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)


def causal_mask_without_the_diagonal(length):
    positions = torch.arange(length)
    return positions[None, :] < positions[:, None]


def causal_mask_upper(length):
    return torch.triu(torch.ones(length, length, dtype=torch.bool))


def causal_mask_of_floats(length):
    return torch.tril(torch.ones(length, length))


def my_padding_mask(lengths, max_len):
    """The (B, 1, 1, max_len) key-padding mask, True on the real tokens."""
    keep = torch.arange(max_len)[None, :] < lengths[:, None]  # (B, L)
    return keep[:, None, None, :]


def my_padding_mask_stub(lengths, max_len):
    """The (B, 1, 1, max_len) key-padding mask, True on the real tokens."""
    raise NotImplementedError("write your solution here")


def padding_mask_true_on_the_padding(lengths, max_len):
    return (torch.arange(max_len) >= lengths[:, None])[:, None, None, :]


def padding_mask_off_by_one(lengths, max_len):
    return (torch.arange(max_len) <= lengths[:, None])[:, None, None, :]


def padding_mask_of_shape_b_l(lengths, max_len):
    return torch.arange(max_len) < lengths[:, None]


def my_decoding_mask(num_new, num_cached):
    """The (num_new, num_cached + num_new) mask of new queries against the cache."""
    total = num_cached + num_new
    full = torch.tril(torch.ones(total, total, dtype=torch.bool))  # causal over all
    return full[num_cached:]  # the rows of the new queries


def my_decoding_mask_stub(num_new, num_cached):
    """The (num_new, num_cached + num_new) mask of new queries against the cache."""
    raise NotImplementedError("write your solution here")


def decoding_mask_like_is_causal(num_new, num_cached):
    return torch.tril(torch.ones(num_new, num_cached + num_new, dtype=torch.bool))


def decoding_mask_without_the_cache(num_new, num_cached):
    return torch.tril(torch.ones(num_new, num_new, dtype=torch.bool))


def decoding_mask_blocking_the_cache(num_new, num_cached):
    cache = torch.zeros(num_new, num_cached, dtype=torch.bool)
    new = torch.tril(torch.ones(num_new, num_new, dtype=torch.bool))
    return torch.cat([cache, new], dim=1)


def my_masked_weights(scores, mask):
    """Softmax weights of scores, 0 where mask is False (True = may attend)."""
    filled = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(filled, dim=-1)
    # a row with nothing to attend to is 0/0 = NaN: give it zeros
    return torch.nan_to_num(weights, nan=0.0)


def my_masked_weights_stub(scores, mask):
    """Softmax weights of scores, 0 where mask is False (True = may attend)."""
    raise NotImplementedError("write your solution here")


def masked_weights_inverted(scores, mask):
    return torch.softmax(scores.masked_fill(mask, float("-inf")), -1).nan_to_num(0.0)


def masked_weights_with_minus_1e9(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def masked_weights_with_nan_rows(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def masked_weights_after_the_softmax(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


ROWS = [
    Row(
        ch04.check_causal_mask,
        my_causal_mask,
        my_causal_mask_stub,
        (
            (causal_mask_true_on_the_future, "the mask looks inverted"),
            (causal_mask_without_the_diagonal, "the diagonal is blocked"),
            (causal_mask_upper, "this is the upper triangle"),
            (causal_mask_of_floats, "a mask is a bool tensor"),
        ),
    ),
    Row(
        ch04.check_padding_mask,
        my_padding_mask,
        my_padding_mask_stub,
        (
            (padding_mask_true_on_the_padding, "the mask looks inverted"),
            (padding_mask_off_by_one, "off by one"),
            (padding_mask_of_shape_b_l, "add the axes of heads and queries"),
        ),
    ),
    Row(
        ch04.check_decoding_mask,
        my_decoding_mask,
        my_decoding_mask_stub,
        (
            (decoding_mask_like_is_causal, "aligned top-left"),
            (decoding_mask_without_the_cache, "the cached keys are missing"),
            (decoding_mask_blocking_the_cache, "the cached keys are blocked"),
        ),
    ),
    Row(
        ch04.check_masked_weights,
        my_masked_weights,
        my_masked_weights_stub,
        (
            (masked_weights_inverted, "the mask looks inverted"),
            (masked_weights_with_minus_1e9, "a finite fill leaks"),
            (masked_weights_with_nan_rows, "give that row weights of 0"),
            (masked_weights_after_the_softmax, "the mask is applied after the softmax"),
        ),
    ),
]
