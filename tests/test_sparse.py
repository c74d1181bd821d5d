"""Tests for attention/efficient/sparse.py: each kernel equals dense attention with its
mask.

Reference: the materialising ``attention.scaled_dot_product_attention`` (and PyTorch's
``scaled_dot_product_attention``) with ``sliding_window_mask`` / ``block_sparse_mask``
(True = may attend), in float64, for the outputs and for the gradients of query, key and
value. The CPU fast path of block-sparse attention (``attention.efficient._sparse_cpu``)
is tested in tests/test_sparse_cpu.py.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import attention.efficient.sparse as sparse_module
from attention import (
    block_sparse_attention,
    block_sparse_mask,
    local_global_layout,
    scaled_dot_product_attention,
    sliding_window_attention,
    sliding_window_mask,
)
from conftest import qkv as shared_qkv


def qkv(n, *, grad=True, **options):
    """The shared helper, with gradients on by default (every test here checks them)."""
    return shared_qkv(n, grad=grad, **options)


def assert_same_with_grads(out, ref, inputs):
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def causal(i, j):
    return torch.ones(i, j, dtype=torch.bool).tril()


def random_layout(rows, cols, seed, p=0.4):
    return torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < p


# --- sliding window -------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 37, 130])
@pytest.mark.parametrize("window", [0, 1, 7, 16, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sliding_window_equals_dense_with_mask(n, window, is_causal):
    q, k, v = qkv(n, seed=n + window)
    out = sliding_window_attention(q, k, v, window=window, is_causal=is_causal)
    mask = sliding_window_mask(n, window, is_causal=is_causal)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == (2, 3, n, 5)
    assert_same_with_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("block_size", [1, 3, 16, 50, 200])
def test_sliding_window_any_block_size_gives_the_same_result(block_size):
    q, k, v = qkv(77, batch=(2,))
    ref = scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(77, 9))
    out = sliding_window_attention(q, k, v, window=9, block_size=block_size)
    assert_same_with_grads(out, ref, (q, k, v))


def test_sliding_window_in_small_steps_gives_the_same_result():
    q, k, v = qkv(45, batch=(1,))
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=sliding_window_mask(45, (4, 0))
    )
    out = sparse_module._sliding_window(
        q, k, v, None, 8**-0.5, 4, 0, 4, chunk_elements=1
    )
    assert_same_with_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("i, j", [(5, 12), (12, 5), (1, 30), (9, 9)])
@pytest.mark.parametrize("window", [(3, 0), (0, 2), (2, 5), (None, 0), (4, None), 3])
def test_sliding_window_pairs_and_rectangles_equal_dense(i, j, window):
    # (left, right) windows; with i != j the queries are the last i positions
    q, k, v = qkv(i, j=j, batch=(2,), seed=i * j)
    mask = sliding_window_mask(i, window, j=j)
    out = sliding_window_attention(q, k, v, window=window, block_size=3)
    assert_same_with_grads(
        out, scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v)
    )


def test_sliding_window_decoding_step_is_the_last_row():
    # one new query against a cache: the last row of the full causal local attention
    q, k, v = qkv(20, batch=(1, 2), grad=False)
    full = sliding_window_attention(q, k, v, window=(4, 0))
    step = sliding_window_attention(q[..., -1:, :], k, v, window=(4, 0))
    torch.testing.assert_close(step, full[..., -1:, :])


def test_sliding_window_matches_torch_and_scale():
    q, k, v = qkv(33, batch=(1, 2))
    mask = sliding_window_mask(33, 5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, window=5, scale=0.3), ref
    )


@pytest.mark.parametrize("float_mask", [False, True])
def test_sliding_window_with_attn_mask(float_mask):
    q, k, v = qkv(40, batch=(2, 3), seed=3)
    g = torch.Generator().manual_seed(1)
    user = torch.rand(2, 1, 40, 40, generator=g) < 0.6  # some rows see nothing at all
    window = sliding_window_mask(40, (5, 2))
    if float_mask:
        user = torch.randn(1, 3, 40, 40, generator=g, dtype=torch.float64)
        ref_mask = user.masked_fill(~window, float("-inf"))
    else:
        ref_mask = user & window
    out = sliding_window_attention(q, k, v, window=(5, 2), attn_mask=user, block_size=8)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    assert_same_with_grads(out, ref, (q, k, v))


def test_sliding_window_grouped_query_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 30, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, 2, 30, 8, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    out = sliding_window_attention(q, k, v, window=(6, 1), enable_gqa=True)
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=sliding_window_mask(30, (6, 1)), enable_gqa=True
    )
    assert_same_with_grads(out, ref, (q, k, v))


def test_sliding_window_broadcasts_batch_dims_and_handles_empty():
    q, k, v = qkv(10, batch=(2, 3))
    out = sliding_window_attention(q, k[:1], v[:1], window=2)
    ref = scaled_dot_product_attention(
        q, k[:1], v[:1], attn_mask=sliding_window_mask(10, 2)
    )
    torch.testing.assert_close(out, ref)


@given(
    i=st.integers(1, 40),
    j=st.integers(1, 40),
    left=st.one_of(st.none(), st.integers(0, 45)),
    right=st.one_of(st.none(), st.integers(0, 45)),
    block=st.integers(1, 20),
)
def test_sliding_window_property(i, j, left, right, block):
    g = torch.Generator().manual_seed(i * 41 + j)
    q = torch.randn(i, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(j, 4, generator=g, dtype=torch.float64) for _ in range(2))
    out = sliding_window_attention(q, k, v, window=(left, right), block_size=block)
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=sliding_window_mask(i, (left, right), j=j)
    )
    torch.testing.assert_close(out, ref)


def test_sliding_window_float32_matches_torch():
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=sliding_window_mask(300, 20)
    )
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, window=20), ref, atol=1e-5, rtol=1e-4
    )


# --- block sparse ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 37, 130])
@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_block_sparse_equals_dense_with_mask(n, block_size):
    nb = -(-n // block_size)
    layout = random_layout(nb, nb, n * block_size)
    q, k, v = qkv(n, seed=n)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=block_size)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, block_size, n)
    )
    assert_same_with_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_local_global_layout(is_causal):
    n, B = 200, 16
    layout = local_global_layout(-(-n // B), 1, 1, is_causal=is_causal)
    q, k, v = qkv(n, batch=(1, 2))
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, B, n)
    )
    assert_same_with_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("i, j", [(45, 45), (20, 45), (45, 20)])
def test_block_sparse_is_causal_is_top_left_like_torch(i, j):
    B = 8
    layout = random_layout(-(-i // B), -(-j // B), i + j, p=0.7)
    q, k, v = qkv(i, j=j, batch=(2,))
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B, is_causal=True)
    mask = block_sparse_mask(layout, B, (i, j)) & causal(i, j)
    assert_same_with_grads(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v)
    )


@pytest.mark.parametrize("float_mask", [False, True])
def test_block_sparse_with_attn_mask(float_mask):
    n, B = 50, 8
    layout = local_global_layout(7, 1, 1)
    q, k, v = qkv(n, batch=(2, 3), seed=5)
    g = torch.Generator().manual_seed(2)
    kept = block_sparse_mask(layout, B, n)
    if float_mask:
        user = torch.randn(3, n, n, generator=g, dtype=torch.float64)
        ref_mask = user.masked_fill(~kept, float("-inf"))
    else:
        user = torch.rand(2, 1, 1, n, generator=g) < 0.7  # a key padding mask
        ref_mask = user & kept
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B, attn_mask=user)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_grouped_query_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 40, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(1, 2, 40, 4, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    layout = local_global_layout(5, 1, 1)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=8, enable_gqa=True)
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, 8, 40), enable_gqa=True
    )
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_rectangular_and_scale():
    q, k, v = qkv(20, j=45, batch=(2,))
    layout = random_layout(3, 6, 1, p=0.6)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=8, scale=0.2)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, 8, (20, 45)), scale=0.2
    )
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_in_small_steps_gives_the_same_result():
    q, k, v = qkv(50, batch=(1,))
    layout = local_global_layout(7, 1, 1)
    out = sparse_module._block_sparse_gather(
        q, k, v, None, True, 0.3, layout, 8, chunk_elements=1
    )
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, 8, 50) & causal(50, 50), scale=0.3
    )
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_fully_masked_rows_are_zero_like_the_reference():
    n, B = 30, 8
    layout = random_layout(4, 4, 3, p=0.7)
    layout[1] = False  # query block 1 attends to nothing
    layout[3] = False  # and the partial last block
    q, k, v = qkv(n, batch=(2,))
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, B, n)
    )
    assert (out[..., 8:16, :] == 0).all() and (out[..., 24:, :] == 0).all()
    assert_same_with_grads(out, ref, (q, k, v))
    empty = torch.zeros(4, 4, dtype=torch.bool)
    assert (block_sparse_attention(q, k, v, layout=empty, block_size=B) == 0).all()


@given(
    i=st.integers(1, 40),
    j=st.integers(1, 40),
    block=st.integers(1, 12),
    seed=st.integers(0, 10),
    is_causal=st.booleans(),
)
def test_block_sparse_property(i, j, block, seed, is_causal):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(i, 4, generator=g, dtype=torch.float64)
    k, v = (
        torch.randn(j, 4, generator=g, dtype=torch.float64),
        torch.randn(j, 3, generator=g, dtype=torch.float64),
    )
    layout = random_layout(-(-i // block), -(-j // block), seed)
    out = block_sparse_attention(
        q, k, v, layout=layout, block_size=block, is_causal=is_causal
    )
    mask = block_sparse_mask(layout, block, (i, j)) & (
        causal(i, j) if is_causal else True
    )
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )


# --- what a query may not see never reaches it; NaN it may see propagates -------------


POISON = [float("nan"), float("inf"), -float("inf"), 1e300]


@pytest.mark.parametrize("poison", POISON)
@pytest.mark.parametrize("window", [7, (7, 0), (2, 9)])
def test_sliding_window_values_outside_the_window_never_reach_a_row(poison, window):
    n, bad = 60, 41
    q, k, v = qkv(n, batch=(1, 2), grad=False)
    v2 = v.clone()
    v2[..., bad, :] = poison
    mask = sliding_window_mask(n, window)
    a = sliding_window_attention(q, k, v, window=window, block_size=16)
    b = sliding_window_attention(q, k, v2, window=window, block_size=16)
    blind = ~mask[:, bad]  # the queries that may not see the poisoned value
    torch.testing.assert_close(b[..., blind, :], a[..., blind, :])


@pytest.mark.parametrize("poison", POISON)
@pytest.mark.parametrize("window", [7, (7, 0), (2, 9)])
def test_sliding_window_non_finite_keys_follow_the_dense_reference(poison, window):
    """The package's one rule for scores: a NaN or +inf score poisons its row even where
    the key is hidden (as torch adds the mask); finite scores of hidden keys change
    nothing."""
    n, bad = 60, 41
    q, k, v = qkv(n, batch=(1, 2), grad=False)
    k2 = k.clone()
    k2[..., bad, :] = poison
    mask = sliding_window_mask(n, window)
    got = sliding_window_attention(q, k2, v, window=window, block_size=16)
    torch.testing.assert_close(
        got, scaled_dot_product_attention(q, k2, v, attn_mask=mask), equal_nan=True
    )
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k2, v, attn_mask=mask), equal_nan=True
    )
    if poison == 1e300:
        assert not got.isnan().any()


@pytest.mark.parametrize("poison", POISON)
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_hidden_values_never_reach_a_row_and_keys_follow_the_reference(
    poison, is_causal
):
    n, B, bad = 45, 8, 30
    layout = random_layout(6, 6, 5, p=0.5)
    layout[3, 3] = layout[0, 3] = True
    q, k, v = qkv(n, batch=(1,), grad=False)
    v2 = v.clone()
    v2[..., bad, :] = poison
    mask = block_sparse_mask(layout, B, n) & (causal(n, n) if is_causal else True)
    a = block_sparse_attention(
        q, k, v, layout=layout, block_size=B, is_causal=is_causal
    )
    b = block_sparse_attention(
        q, k, v2, layout=layout, block_size=B, is_causal=is_causal
    )
    blind = ~mask[:, bad]
    torch.testing.assert_close(b[..., blind, :], a[..., blind, :])
    if poison != poison:
        assert b[..., ~blind, :].isnan().all()
    k2 = k.clone()
    k2[..., bad, :] = poison
    got = block_sparse_attention(
        q, k2, v, layout=layout, block_size=B, is_causal=is_causal
    )
    torch.testing.assert_close(
        got, scaled_dot_product_attention(q, k2, v, attn_mask=mask), equal_nan=True
    )


def _minus_inf_key(n, e=4, big=False):
    """Inputs where key 41 scores -inf for every query (q[..., 0] = 4 > 0): it holds
    -inf, or (big) a finite -1e308 whose product with 4 overflows to -inf."""
    q, k, v = qkv(n, batch=(1, 2), d=4, e=e, grad=False)
    q, k = q.clone(), k.clone()
    q[..., 0] = 4.0
    k[..., 41, 0] = -1e308 if big else -float("inf")
    return q, k, v


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("window", [0, (1, 0), 7])
def test_sliding_window_minus_inf_scores_leave_rows_as_the_dense_reference(big, window):
    """The rule: a row's output depends only on the keys and values it may see, except
    that a NaN or +inf score against any key, seen or hidden, poisons the row (torch's
    rule, ``_core.poisoned_rows``). A -inf score poisons nothing: the key gets weight 0,
    and a row whose every visible score is -inf is zero, as in the dense reference. So
    no row here may be NaN (the band path's plain softmax made the row that sees only
    key 41 NaN)."""
    n = 60
    q, k, v = _minus_inf_key(n, big=big)
    got = sliding_window_attention(q, k, v, window=window, block_size=16)
    mask = sliding_window_mask(n, window)
    torch.testing.assert_close(
        got, scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    assert not got.isnan().any()


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_block_sparse_minus_inf_scores_leave_rows_as_the_dense_reference(big, grad):
    """The rule of the test above, for the layout: a global column plus a diagonal, so
    the CPU fast path (no autograd, ``e = d``) merges two runs per row, and the rows of
    block 10 see only -inf scores in their diagonal run. That run must add nothing
    (the fused kernel reports a log-sum-exp of 0 for it, which the merge counted as
    weight)."""
    n, B = 60, 4
    q, k, v = _minus_inf_key(n, e=4, big=big)
    k[..., 40:44, 0] = k[..., 41:42, 0]  # block 10 scores -inf for every query
    layout = torch.eye(15, dtype=torch.bool)
    layout[:, 0] = True
    with torch.set_grad_enabled(grad):
        got = block_sparse_attention(
            q, k, v.requires_grad_(grad), layout=layout, block_size=B
        )
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=block_sparse_mask(layout, B, n)
    )
    torch.testing.assert_close(got, ref)
    assert not got.isnan().any()
    only_minus_inf = torch.eye(15, dtype=torch.bool)  # block 10 sees only block 10
    got = block_sparse_attention(q, k, v, layout=only_minus_inf, block_size=B)
    assert (got[..., 40:44, :] == 0).all() and not got.isnan().any()


def test_attn_mask_hidden_keys_never_reach_a_row():
    q, k, v = qkv(24, batch=(1,), grad=False)
    v2 = v.clone()
    v2[..., 5, :] = float("nan")
    hide = torch.ones(24, 24, dtype=torch.bool)
    hide[:, 5] = False
    a = sliding_window_attention(q, k, v, window=6, attn_mask=hide)
    b = sliding_window_attention(q, k, v2, window=6, attn_mask=hide)
    torch.testing.assert_close(a, b)
    layout = torch.ones(3, 3, dtype=torch.bool)
    a = block_sparse_attention(q, k, v, layout=layout, block_size=8, attn_mask=hide)
    b = block_sparse_attention(q, k, v2, layout=layout, block_size=8, attn_mask=hide)
    torch.testing.assert_close(a, b)


def test_nan_query_and_scale_propagate_as_in_torch():
    q, k, v = qkv(16, batch=(1,), grad=False)
    q2 = q.clone()
    q2[..., 3, 0] = float("nan")
    out = sliding_window_attention(q2, k, v, window=2)
    assert out[..., 3, :].isnan().all() and not out[..., 4, :].isnan().any()
    layout = torch.ones(2, 2, dtype=torch.bool)
    out = block_sparse_attention(q2, k, v, layout=layout, block_size=8)
    assert out[..., 3, :].isnan().all() and not out[..., 4, :].isnan().any()
    assert sliding_window_attention(q, k, v, window=2, scale=float("nan")).isnan().all()


# --- sizes: huge ones clamped, empty axes and d = 0 as torch --------------------------


def test_huge_sizes_are_clamped():
    q, k, v = qkv(5, batch=(1,), grad=False)
    dense = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, window=10**18, block_size=10**9), dense
    )
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, window=(None, None)), dense
    )
    one = torch.ones(1, 1, dtype=torch.bool)
    torch.testing.assert_close(
        block_sparse_attention(q, k, v, layout=one, block_size=10**12), dense
    )
    # a long key axis and one block: the queries are not padded to the block size
    q1, k1, v1 = qkv(3, j=4000, batch=(1,), grad=False)
    out = block_sparse_attention(
        q1, k1, v1, layout=one, block_size=10**6, is_causal=True
    )
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q1, k1, v1, attn_mask=causal(3, 4000))
    )


@pytest.mark.parametrize("i, j", [(0, 5), (5, 0), (0, 0)])
def test_empty_axes_behave_as_torch(i, j):
    q, k, v = qkv(i, j=j, batch=(2,))
    ref = F.scaled_dot_product_attention(q, k, v)
    out = sliding_window_attention(q, k, v, window=2)
    assert out.shape == ref.shape and (out == 0).all()
    layout = torch.ones(-(-i // 4), -(-j // 4), dtype=torch.bool)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=4)
    assert out.shape == ref.shape and (out == 0).all()
    out.sum().backward()  # still in the graph


def test_zero_head_size_behaves_as_torch():
    # d = 0: every score is 0, so each query averages the values it may see
    q, k, v = qkv(9, batch=(2,), d=0, grad=False)
    mask = sliding_window_mask(9, 1)
    torch.testing.assert_close(
        sliding_window_attention(q, k, v, window=1),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )
    layout = local_global_layout(3, 0, 1)
    torch.testing.assert_close(
        block_sparse_attention(q, k, v, layout=layout, block_size=3),
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=block_sparse_mask(layout, 3, 9)
        ),
    )


# --- bad input: one test per class ----------------------------------------------------


KERNELS = {
    "sliding": lambda q, k, v, **kw: sliding_window_attention(q, k, v, window=1, **kw),
    "block": lambda q, k, v, **kw: block_sparse_attention(
        q,
        k,
        v,
        layout=torch.ones(1, 1, dtype=torch.bool, device=q.device),
        block_size=5,
        **kw,
    ),
}


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_bool_flags_must_be_bools(kernel, flag):
    q, k, v = qkv(5)
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        kernel(q, k, v, **{flag: "no"})


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_scale_must_be_a_number(kernel):
    q, k, v = qkv(5)
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        kernel(q, k, v, scale=True)


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_inputs_on_different_devices_are_refused(kernel):
    q, k, v = qkv(5, grad=False)
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        kernel(q, k.to("meta"), v)


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_attn_mask_and_is_causal_together_are_refused(kernel):
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        kernel(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_grouped_heads_must_divide(kernel):
    q, k, v = qkv(5, batch=(1, 3))
    with pytest.raises(ValueError, match="3 query heads and 2 key/value heads"):
        kernel(q, k[:, :2], v[:, :2], enable_gqa=True)


def test_sizes_must_be_ints():
    q, k, v = qkv(5)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        sliding_window_attention(q, k, v, window=1, block_size=2.0)
    with pytest.raises(TypeError, match="window must be an int w"):
        sliding_window_attention(q, k, v, window=1.5)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        block_sparse_attention(
            q, k, v, layout=torch.ones(1, 1, dtype=torch.bool), block_size=5.0
        )


def test_sizes_must_be_in_range():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="window left must be >= 0, got -1"):
        sliding_window_attention(q, k, v, window=-1)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        sliding_window_attention(q, k, v, window=1, block_size=0)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        block_sparse_attention(
            q, k, v, layout=torch.ones(1, 1, dtype=torch.bool), block_size=0
        )


def test_sliding_window_is_causal_needs_as_many_queries_as_keys():
    q, k, v = qkv(5, j=6)
    with pytest.raises(ValueError, match=r"got i=5 and j=6; .*window=\(left, 0\)"):
        sliding_window_attention(q, k, v, window=1, is_causal=True)


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_sparse_kernels_check_d(kernel):
    q, k, v = qkv(5)
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 8 and 4"
    ):
        kernel(q, k[..., :4], v)


def test_block_sparse_rejects_bad_layouts():
    q, k, v = qkv(37)
    with pytest.raises(
        ValueError, match=r"layout has 2 query blocks but 37 query positions"
    ):
        block_sparse_attention(
            q, k, v, layout=torch.ones(2, 2, dtype=torch.bool), block_size=16
        )
    with pytest.raises(TypeError, match="layout must be boolean"):
        block_sparse_attention(q, k, v, layout=torch.ones(3, 3), block_size=16)
    with pytest.raises(
        ValueError,
        match="query and layout must be on the same device, got cpu and meta",
    ):
        block_sparse_attention(
            q,
            k,
            v,
            layout=torch.ones(3, 3, dtype=torch.bool, device="meta"),
            block_size=16,
        )


def test_options_are_keyword_only():
    q, k, v = qkv(8)
    with pytest.raises(TypeError):
        block_sparse_attention(q, k, v, torch.ones(1, 1, dtype=torch.bool), 8)
    with pytest.raises(TypeError):
        sliding_window_attention(q, k, v, 2)


def test_pad_positions_does_not_copy_without_padding():
    x = torch.randn(2, 8, 3)
    assert sparse_module._pad_positions(x, 0, 0) is x
    assert sparse_module._pad_positions(x, 1, 2).shape == (2, 11, 3)


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_value_and_attn_mask_are_checked(kernel):
    q, k, v = qkv(5, grad=False)
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got NoneType"):
        kernel(q, k, None)
    with pytest.raises(ValueError, match="attn_mask"):
        kernel(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match="attn_mask must be boolean"):
        kernel(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.long))


@pytest.mark.parametrize("kernel", KERNELS.values(), ids=KERNELS.keys())
def test_meta_inputs_give_the_output_shape(kernel):
    q, k, v = (t.to("meta") for t in qkv(5, grad=False))
    assert (
        kernel(q, k, v).shape == (2, 3, 5, 5) and kernel(q, k, v).device.type == "meta"
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_torch(dtype):
    q, k, v = (t.to(dtype) for t in qkv(40, batch=(1, 2), grad=False))
    mask = sliding_window_mask(40, (5, 2))
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask
    )
    out = sliding_window_attention(q, k, v, window=(5, 2), block_size=8)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    layout = local_global_layout(5, 1, 1)
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=block_sparse_mask(layout, 8, 40)
    )
    out = block_sparse_attention(q, k, v, layout=layout, block_size=8)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_float32_mask_works_with_any_query_dtype(dtype):
    # torch's fused CPU kernel misreads a float32 mask with batch axes beside float64
    # inputs; the kernels cast the mask to the query's dtype first
    q, k, v = (t.to(dtype) for t in qkv(24, batch=(2, 3), grad=False))
    mask = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    layout = local_global_layout(3, 0, 1)
    kept = block_sparse_mask(layout, 8, 24)
    ref = F.scaled_dot_product_attention(
        q.double(),
        k.double(),
        v.double(),
        attn_mask=mask.double().masked_fill(~kept, float("-inf")),
    )
    out = block_sparse_attention(q, k, v, layout=layout, block_size=8, attn_mask=mask)
    tol = {} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.double(), ref, **tol)
    window = sliding_window_mask(24, 3)
    ref = F.scaled_dot_product_attention(
        q.double(),
        k.double(),
        v.double(),
        attn_mask=mask.double().masked_fill(~window, float("-inf")),
    )
    out = sliding_window_attention(q, k, v, window=3, attn_mask=mask)
    torch.testing.assert_close(out.double(), ref, **tol)
