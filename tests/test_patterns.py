"""Tests for attention/efficient/patterns.py, the sparse patterns of chapter 13.

Every builder is checked against a naive double loop over (query i, key j); the window
conventions against flash-attn's formula and the masks Hugging Face transformers builds.
"""

import importlib.util

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import (
    bigbird_mask,
    block_sparse_mask,
    dilated_mask,
    global_tokens_mask,
    local_global_layout,
    sliding_window_mask,
)


def loop_mask(n, rule, j=None):
    j = n if j is None else j
    return torch.tensor(
        [[rule(a, b) for b in range(j)] for a in range(n)], dtype=torch.bool
    ).reshape(n, j)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 37])
@pytest.mark.parametrize("window", [0, 1, 3, 16, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sliding_window_mask_matches_loop(n, window, is_causal):
    expected = loop_mask(
        n, lambda i, j: abs(i - j) <= window and (not is_causal or j <= i)
    )
    m = sliding_window_mask(n, window, is_causal=is_causal)
    assert m.dtype == torch.bool and torch.equal(m, expected)


@pytest.mark.parametrize("n", [1, 9, 30])
@pytest.mark.parametrize("window, dilation", [(0, 1), (1, 1), (2, 2), (3, 4), (1, 7)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dilated_mask_matches_loop(n, window, dilation, is_causal):
    def rule(i, j):
        return any(
            j == i + s * dilation
            for s in range(-window, (0 if is_causal else window) + 1)
        )

    assert torch.equal(
        dilated_mask(n, window, dilation, is_causal=is_causal), loop_mask(n, rule)
    )


def test_dilation_one_is_sliding_window():
    assert torch.equal(dilated_mask(20, 3, 1), sliding_window_mask(20, 3))


@pytest.mark.parametrize(
    "n, window, global_idx",
    [(1, 0, [0]), (10, 1, [0]), (13, 2, [0, 5, 12]), (8, 0, [])],
)
def test_global_tokens_mask_matches_loop(n, window, global_idx):
    g = set(global_idx)
    expected = loop_mask(n, lambda i, j: abs(i - j) <= window or i in g or j in g)
    assert torch.equal(global_tokens_mask(n, window, global_idx), expected)


def naive_bigbird(n, window, num_global, num_random, block_size, seed):
    """BigBird's recipe block by block: window + global blocks, then random blocks drawn
    (the num_random smallest of independent uniforms) among the blocks left over."""
    nb = -(-n // block_size)
    u = torch.rand(nb, nb, generator=torch.Generator().manual_seed(seed))
    layout = torch.zeros(nb, nb, dtype=torch.bool)
    for r in range(nb):
        base = [
            c
            for c in range(nb)
            if abs(r - c) <= window or r < num_global or c < num_global
        ]
        free = sorted(
            (c for c in range(nb) if c not in base), key=lambda c: float(u[r, c])
        )
        for c in base + free[:num_random]:
            layout[r, c] = True
    return loop_mask(n, lambda i, j: bool(layout[i // block_size, j // block_size]))


@pytest.mark.parametrize(
    "n, window, num_global, num_random, block_size",
    [
        (1, 0, 0, 1, 1),
        (16, 1, 2, 3, 1),
        (33, 2, 1, 0, 1),
        (20, 0, 0, 20, 1),
        (37, 1, 1, 2, 4),
        (64, 1, 2, 3, 8),
        (10, 0, 0, 1, 3),
    ],
)
def test_bigbird_mask_is_window_global_plus_random_blocks(
    n, window, num_global, num_random, block_size
):
    m = bigbird_mask(n, window, num_global, num_random, block_size=block_size, seed=7)
    assert torch.equal(
        m, naive_bigbird(n, window, num_global, num_random, block_size, 7)
    )
    base = naive_bigbird(n, window, num_global, 0, block_size, 7)
    assert torch.equal(m & base, base)  # contains window + global


def test_bigbird_random_keys_are_new_keys():
    # the random keys never repeat a window or global key: every row that is not global
    # and whose window lies inside the sequence keeps exactly (2w + 1 + g + r) keys
    n, w, g, r = 64, 2, 1, 3
    m = bigbird_mask(n, w, g, r, seed=0)
    rows = m[g + w : n - w].sum(
        -1
    )  # rows whose window is whole and outside the global block
    assert (rows == 2 * w + 1 + g + r).all()


def test_bigbird_mask_is_seeded():
    a, b = bigbird_mask(40, 1, 1, 3, seed=1), bigbird_mask(40, 1, 1, 3, seed=1)
    c = bigbird_mask(40, 1, 1, 3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a, bigbird_mask(40, 1, 1, 3, seed=2))


@pytest.mark.parametrize("block_size", [1, 2, 3, 16])
@pytest.mark.parametrize("n", [1, 7, 37])
def test_block_sparse_mask_matches_loop(block_size, n):
    nb = -(-n // block_size)
    layout = torch.rand(nb, nb, generator=torch.Generator().manual_seed(n)) < 0.5
    expected = loop_mask(n, lambda i, j: bool(layout[i // block_size, j // block_size]))
    assert torch.equal(block_sparse_mask(layout, block_size, n), expected)


def test_block_sparse_mask_default_and_rectangular():
    layout = torch.tensor([[True, False, True]])
    assert block_sparse_mask(layout, 2).shape == (2, 6)
    m = block_sparse_mask(layout, 2, (1, 5))
    assert m.int().tolist() == [[1, 1, 0, 0, 1]]


@given(n=st.integers(1, 40), w=st.integers(0, 10), b=st.integers(1, 8))
def test_local_global_layout_expands_to_the_element_pattern(n, w, b):
    # a block layout with window w blocks and one global block, expanded with block_size
    # 1, is global_tokens_mask on the blocks
    layout = local_global_layout(n, w, 1)
    assert torch.equal(layout, global_tokens_mask(n, w, [0]))
    assert torch.equal(
        local_global_layout(n, w, 0, is_causal=True),
        sliding_window_mask(n, w, is_causal=True),
    )
    elements = block_sparse_mask(layout, b)
    assert elements.shape == (n * b, n * b) and elements[0].all()


# --- bad input: one test per rule, matching the message -------------------------------


def test_negative_window_is_rejected():
    with pytest.raises(ValueError, match="window left must be >= 0, got -1"):
        sliding_window_mask(5, -1)
    with pytest.raises(ValueError, match="window left must be >= 0, got -2"):
        global_tokens_mask(5, -2, [0])


def test_dilation_below_one_is_rejected():
    with pytest.raises(ValueError, match="dilation must be >= 1, got 0"):
        dilated_mask(5, 1, 0)


def test_global_index_out_of_range_is_rejected():
    with pytest.raises(ValueError, match=r"global_idx must lie in \[0, n=4\)"):
        global_tokens_mask(4, 1, [4])


def test_bigbird_counts_are_checked():
    with pytest.raises(
        ValueError, match=r"num_random must be <= ceil\(n / block_size\)=4, got 5"
    ):
        bigbird_mask(4, 1, 0, 5, seed=0)
    with pytest.raises(
        ValueError, match=r"num_random must be <= ceil\(n / block_size\)=2, got 3"
    ):
        bigbird_mask(4, 1, 0, 3, block_size=2, seed=0)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        bigbird_mask(4, 1, 0, 1, block_size=0, seed=0)
    with pytest.raises(
        ValueError, match=r"num_global must be <= ceil\(n / block_size\)=4, got 5"
    ):
        bigbird_mask(4, 1, 5, 0, seed=0)
    with pytest.raises(ValueError, match="either generator or seed"):
        bigbird_mask(4, 1, 0, 1, seed=0, generator=torch.Generator())


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        block_sparse_mask(torch.ones(2, 2, dtype=torch.bool), 0)


def test_block_layout_shape_must_match_length():
    with pytest.raises(
        ValueError, match=r"layout has 2 query blocks but 9 query positions"
    ):
        block_sparse_mask(torch.ones(2, 2, dtype=torch.bool), 4, 9)


def test_block_layout_must_be_boolean_2d():
    with pytest.raises(TypeError, match="layout must be boolean"):
        block_sparse_mask(torch.ones(2, 2), 4)
    with pytest.raises(ValueError, match="layout must be a 2-D"):
        block_sparse_mask(torch.ones(2, dtype=torch.bool), 4)


# --- window conventions: (left, right), rectangular, flash-attn, Hugging Face ---------


@given(
    i=st.integers(0, 12),
    j=st.integers(0, 12),
    left=st.one_of(st.none(), st.integers(0, 14)),
    right=st.one_of(st.none(), st.integers(0, 14)),
)
def test_window_pair_is_flash_attn_window_size_bottom_right(i, j, left, right):
    # flash-attn: query a sits at position a + j - i; it sees keys in
    # [p - left, p + right], -1 (here None) meaning unbounded on that side
    lo = -(10**9) if left is None else -left
    hi = 10**9 if right is None else right
    expected = loop_mask(i, lambda a, b: lo <= b - (a + j - i) <= hi, j)
    assert torch.equal(sliding_window_mask(i, (left, right), j=j), expected)


@pytest.mark.parametrize("w", [0, 1, 3, 9])
def test_int_window_is_the_symmetric_pair(w):
    assert torch.equal(sliding_window_mask(11, w), sliding_window_mask(11, (w, w)))
    assert torch.equal(
        sliding_window_mask(11, w, is_causal=True), sliding_window_mask(11, (w, 0))
    )


needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed",
)


@pytest.mark.slow  # imports transformers: make test, not make check
@needs_transformers
@pytest.mark.parametrize("i, j", [(9, 9), (1, 9), (4, 9)])
@pytest.mark.parametrize("w", [1, 2, 4, 20])
def test_hugging_face_sliding_window_counts_the_query(i, j, w):
    from transformers.masking_utils import (
        sliding_window_bidirectional_mask_function,
        sliding_window_causal_mask_function,
    )

    query_pos = torch.arange(j - i, j)[:, None]  # HF indexes queries by cache position
    key_pos = torch.arange(j)[None, :]
    hf_causal = sliding_window_causal_mask_function(w)(0, 0, query_pos, key_pos)
    assert torch.equal(sliding_window_mask(i, (w - 1, 0), j=j), hf_causal)
    hf_both = sliding_window_bidirectional_mask_function(w)(0, 0, query_pos, key_pos)
    assert torch.equal(sliding_window_mask(i, w, j=j), hf_both.expand(i, j))


def test_huge_sizes_are_clamped():
    assert sliding_window_mask(5, 10**30).all()
    assert sliding_window_mask(3, (10**30, None), j=5).all()
    assert torch.equal(dilated_mask(5, 10**18, 10**18), torch.eye(5, dtype=torch.bool))
    assert block_sparse_mask(torch.ones(1, 1, dtype=torch.bool), 10**12, 5).shape == (
        5,
        5,
    )
    assert global_tokens_mask(4, 10**20, []).all()


def test_is_causal_needs_a_square_mask():
    with pytest.raises(
        ValueError,
        match=r"is_causal=True needs as many queries as keys here, got i=2 and j=5; "
        r".* window=\(left, 0\)",
    ):
        sliding_window_mask(2, 1, j=5, is_causal=True)


@pytest.mark.parametrize("window", [1.5, True, "2", (1,), (1, 2, 3), None])
def test_window_must_be_an_int_or_a_pair(window):
    with pytest.raises(TypeError, match="window must be an int w"):
        sliding_window_mask(5, window)


def test_window_sides_must_be_non_negative_ints_or_none():
    with pytest.raises(ValueError, match="window left must be >= 0, got -1"):
        sliding_window_mask(5, (-1, 0))
    with pytest.raises(TypeError, match="window right must be an int, got float"):
        sliding_window_mask(5, (1, 0.5))


@pytest.mark.parametrize(
    "builder",
    [
        lambda flag: sliding_window_mask(4, 1, is_causal=flag),
        lambda flag: dilated_mask(4, 1, 2, is_causal=flag),
        lambda flag: local_global_layout(4, 1, 1, is_causal=flag),
    ],
)
def test_bool_flags_must_be_bools(builder):
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        builder("yes")


def test_bigbird_generator_must_be_a_cpu_generator():
    with pytest.raises(
        TypeError, match="generator must be a torch.Generator or None, got int"
    ):
        bigbird_mask(4, 1, 0, 1, generator=3)


@pytest.mark.parametrize("n", [1.0, "4", None])
def test_sizes_must_be_ints(n):
    with pytest.raises(TypeError, match="must be an int"):
        sliding_window_mask(n, 1)


def test_global_idx_must_be_integer_positions():
    with pytest.raises(
        ValueError, match="global_idx must be a 1-D sequence of integer positions"
    ):
        global_tokens_mask(4, 1, [0.5])
    with pytest.raises(
        TypeError, match="global_idx must be a 1-D sequence of integer positions"
    ):
        global_tokens_mask(4, 1, 3)


def test_empty_patterns():
    assert sliding_window_mask(0, 2).shape == (0, 0)
    assert sliding_window_mask(0, 2, j=3).shape == (0, 3)
    assert sliding_window_mask(3, 2, j=0).shape == (3, 0)
    assert local_global_layout(0, 1, 0).shape == (0, 0)
    assert block_sparse_mask(torch.zeros(0, 2, dtype=torch.bool), 4, (0, 5)).shape == (
        0,
        5,
    )


def test_device_is_honoured():
    meta = torch.device("meta")
    for m in (
        sliding_window_mask(4, 1, device=meta),
        dilated_mask(4, 1, 2, device=meta),
        global_tokens_mask(4, 1, [0], device=meta),
        local_global_layout(3, 1, 1, device=meta),
    ):
        assert m.device == meta


def test_bad_devices_are_refused():
    with pytest.raises(ValueError, match="device is not a valid device: 'nowhere'"):
        sliding_window_mask(4, 1, device="nowhere")
    with pytest.raises(TypeError, match="device must be a torch.device"):
        dilated_mask(4, 1, 2, device=1.5)


def test_masks_that_cannot_fit_are_refused_before_building():
    with pytest.raises(
        ValueError, match=r"an \(1000000000000000000000000000000, 3\) mask does not fit"
    ):
        sliding_window_mask(10**30, 1, j=3)
    with pytest.raises(ValueError, match="mask does not fit in memory"):
        block_sparse_mask(torch.ones(2, 2, dtype=torch.bool), 10**20)


def test_bigbird_seed_must_fit_in_64_bits():
    assert torch.equal(
        bigbird_mask(6, 1, 1, 2, seed=-1), bigbird_mask(6, 1, 1, 2, seed=-1)
    )
    with pytest.raises(ValueError, match="seed must fit in 64 bits"):
        bigbird_mask(6, 1, 1, 2, seed=2**64)
