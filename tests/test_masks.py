"""Tests for attention/foundations/masks.py: every builder against a naive double
loop."""

import pytest
import torch

from attention import block_diagonal_mask, causal_mask, combine_masks, padding_mask
from attention.foundations.masks import decoding_mask, to_additive_mask


@pytest.mark.parametrize("i, j", [(1, 1), (3, 3), (3, 5), (5, 3), (0, 2)])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_causal_mask_matches_loop(i, j, align):
    offset = 0 if align == "top-left" else j - i
    expected = torch.tensor(
        [[k <= q + offset for k in range(j)] for q in range(i)], dtype=torch.bool
    ).reshape(i, j)
    assert torch.equal(causal_mask(i, j, align=align), expected)


def test_causal_mask_is_what_torch_is_causal_means():
    q = torch.randn(1, 4, 3, dtype=torch.float64)
    k, v = (
        torch.randn(1, 6, 3, dtype=torch.float64),
        torch.randn(1, 6, 2, dtype=torch.float64),
    )
    f = torch.nn.functional.scaled_dot_product_attention
    torch.testing.assert_close(
        f(q, k, v, is_causal=True), f(q, k, v, attn_mask=causal_mask(4, 6))
    )


def test_decoding_mask_is_cached_block_plus_triangle():
    m = decoding_mask(3, 4)
    assert m.shape == (3, 7)
    assert m[:, :4].all()
    assert torch.equal(m[:, 4:], torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    assert torch.equal(m, causal_mask(3, 7, align="bottom-right"))


def test_padding_mask_shape_and_values():
    m = padding_mask(torch.tensor([1, 3, 0]), 3)
    assert m.shape == (3, 1, 1, 3) and m.dtype == torch.bool
    assert m[:, 0, 0].int().tolist() == [[1, 0, 0], [1, 1, 1], [0, 0, 0]]


def test_combine_and_broadcast():
    m = combine_masks(None, causal_mask(4), padding_mask([2, 4], 4))
    assert m.shape == (2, 1, 4, 4)
    expected = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    for b, length in enumerate([2, 4]):
        for q in range(4):
            for k in range(4):
                expected[b, 0, q, k] = k <= q and k < length
    assert torch.equal(m, expected)
    assert combine_masks(None, None) is None


def test_additive_mask_equals_boolean_in_attention():
    mask = combine_masks(causal_mask(4), padding_mask([3], 4))
    add = to_additive_mask(mask, torch.float64)
    assert add.dtype == torch.float64
    assert set(add.unique().tolist()) == {0.0, float("-inf")}
    q, k, v = (torch.randn(1, 1, 4, 5, dtype=torch.float64) for _ in range(3))
    f = torch.nn.functional.scaled_dot_product_attention
    torch.testing.assert_close(f(q, k, v, attn_mask=mask), f(q, k, v, attn_mask=add))


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: causal_mask(-1), ValueError, "i must be >= 0, got -1"),
        (lambda: causal_mask(2.5), TypeError, "i must be an int, got float"),
        (lambda: causal_mask(2, 3, align="left"), ValueError, "align must be"),
        (
            lambda: padding_mask([1, 4], 3),
            ValueError,
            r"lengths must lie in \[0, j=3\], got \[1, 4\]",
        ),
        (
            lambda: padding_mask(torch.tensor([[1]]), 3),
            ValueError,
            r"lengths must be 1-D, one length per sequence, got shape \(1, 1\)",
        ),
        (
            lambda: combine_masks(
                torch.ones(2, 3, dtype=torch.bool), torch.ones(4, 3, dtype=torch.bool)
            ),
            ValueError,
            r"masks must broadcast .* got \(2, 3\) and \(4, 3\)",
        ),
        (lambda: combine_masks(torch.ones(2, 2)), TypeError, "boolean masks"),
        (lambda: to_additive_mask(torch.ones(2, 2)), TypeError, "mask must be boolean"),
        (
            lambda: to_additive_mask(causal_mask(2), torch.int64),
            TypeError,
            "floating-point dtype",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_shape_broadcasting_rule_matches_torch():
    from attention._checks import _broadcast

    cases = [
        ((2, 1, 3), (4, 3)),
        ((1,), (5, 1)),
        ((), (2, 2)),
        ((2, 3), (3, 2)),
        ((0, 1), (1, 4)),
    ]
    for a, b in cases:
        try:
            expected = tuple(torch.broadcast_shapes(a, b))
        except RuntimeError:
            expected = None
        assert _broadcast(a, b) == expected


# ------------------------------------------------------- left padding, packed sequences


def test_left_padding_puts_the_real_tokens_at_the_end():
    m = padding_mask(torch.tensor([1, 3, 0]), 3, side="left")
    assert m[:, 0, 0].int().tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 0]]
    assert torch.equal(m, padding_mask([1, 3, 0], 3).flip(-1))


def test_padding_mask_refuses_float_lengths_instead_of_truncating():
    with pytest.raises(TypeError, match="lengths must hold ints, got float 1.5"):
        padding_mask([1.5, 2.7], 3)
    with pytest.raises(
        TypeError, match="lengths must be an integer tensor, got dtype torch.float32"
    ):
        padding_mask(torch.tensor([1.0, 2.0]), 3)
    with pytest.raises(
        ValueError, match="side must be one of 'right', 'left', got 'top'"
    ):
        padding_mask([1], 3, side="top")
    with pytest.raises(ValueError, match=r"lengths must be >= 0, got \[-1\]"):
        padding_mask([-1], 3)


def test_block_diagonal_mask_matches_a_loop():
    lengths = [2, 0, 3, 1]
    segment = [s for s, n in enumerate(lengths) for _ in range(n)]
    expected = torch.tensor([[a == b for b in segment] for a in segment])
    assert torch.equal(block_diagonal_mask(lengths), expected)
    causal = block_diagonal_mask(torch.tensor(lengths), is_causal=True)
    assert torch.equal(causal, expected & causal_mask(6))
    assert block_diagonal_mask([]).shape == (0, 0)


def test_packed_attention_equals_attention_on_each_sequence():
    lengths = [3, 1, 4]
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, sum(lengths), 5, dtype=torch.float64, generator=g)
        for _ in range(3)
    )
    f = torch.nn.functional.scaled_dot_product_attention
    for is_causal in (False, True):
        packed = f(q, k, v, attn_mask=block_diagonal_mask(lengths, is_causal=is_causal))
        starts = [0, 3, 4, 8]
        apart = torch.cat(
            [
                f(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=is_causal)
                for a, b in zip(starts, starts[1:])
            ],
            dim=1,
        )
        torch.testing.assert_close(packed, apart)


def test_mask_builders_refuse_bad_flags_and_devices():
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        block_diagonal_mask([2], is_causal=1)
    with pytest.raises(TypeError, match="device must be a torch.device"):
        causal_mask(2, device=3.0)
    with pytest.raises(
        ValueError,
        match="mask 0 and mask 1 must be on the same device, got cpu and meta",
    ):
        combine_masks(causal_mask(2), causal_mask(2, device="meta"))
