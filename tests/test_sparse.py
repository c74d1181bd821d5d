"""Tests for attention/sparse.py: each kernel equals dense attention with its mask.

Reference: the materialising ``attention.scaled_dot_product_attention`` with
``sliding_window_mask`` / ``block_sparse_mask`` (True = may attend), in float64, for the
outputs and for the gradients of query, key and value.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attention.sparse as sparse_module
from attention import (
    block_sparse_attention,
    block_sparse_mask,
    local_global_layout,
    scaled_dot_product_attention,
    sliding_window_attention,
    sliding_window_mask,
)


def qkv(n, *, batch=(2, 3), d=8, e=5, seed=0, j=None):
    g = torch.Generator().manual_seed(seed)
    j = n if j is None else j
    q = torch.randn(*batch, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*batch, j, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(*batch, j, e, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


def assert_same_with_grads(out, ref, inputs):
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


# --- sliding window ----------------------------------------------------------------------


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


def test_sliding_window_in_small_steps_gives_the_same_result(monkeypatch):
    monkeypatch.setattr(sparse_module, "_CHUNK_ELEMENTS", 1)  # one block per step
    q, k, v = qkv(45, batch=(1,))
    ref = scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(45, 4, is_causal=True))
    out = sliding_window_attention(q, k, v, window=4, is_causal=True, block_size=4)
    assert_same_with_grads(out, ref, (q, k, v))


def test_sliding_window_matches_torch_and_scale():
    q, k, v = qkv(33, batch=(1, 2))
    mask = sliding_window_mask(33, 5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(sliding_window_attention(q, k, v, window=5, scale=0.3), ref)


def test_sliding_window_broadcasts_batch_dims_and_handles_empty():
    q, k, v = qkv(10, batch=(2, 3))
    out = sliding_window_attention(q, k[:1], v[:1], window=2)
    ref = scaled_dot_product_attention(q, k[:1], v[:1], attn_mask=sliding_window_mask(10, 2))
    torch.testing.assert_close(out, ref)
    empty = torch.zeros(2, 0, 4)
    assert sliding_window_attention(empty, empty, torch.zeros(2, 0, 3), window=1).shape == (2, 0, 3)


def test_sliding_window_ignores_poisoned_keys_outside_the_window():
    # keys and values at positions >= 60 are poisoned; queries i < 60 - window never see them
    n, window = 100, 7
    q, k, v = (t.detach() for t in qkv(n, batch=(1,)))
    k2, v2 = k.clone(), v.clone()
    k2[..., 60:, :], v2[..., 60:, :] = 1e9, 1e9
    a = sliding_window_attention(q, k, v, window=window)
    b = sliding_window_attention(q, k2, v2, window=window)
    torch.testing.assert_close(a[..., : 60 - window, :], b[..., : 60 - window, :], rtol=0, atol=0)
    # causal: poisoning the future changes nothing before it
    c = sliding_window_attention(q, k, v, window=window, is_causal=True)
    d = sliding_window_attention(q, k2, v2, window=window, is_causal=True)
    torch.testing.assert_close(c[..., :60, :], d[..., :60, :], rtol=0, atol=0)


@given(n=st.integers(1, 70), window=st.integers(0, 80), causal=st.booleans(), block=st.integers(1, 40))
def test_sliding_window_property(n, window, causal, block):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(n, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = sliding_window_attention(q, k, v, window=window, is_causal=causal, block_size=block)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(n, window, is_causal=causal))
    torch.testing.assert_close(out, ref)


def test_sliding_window_float32_matches_torch():
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(300, 20))
    torch.testing.assert_close(sliding_window_attention(q, k, v, window=20), ref, atol=1e-5, rtol=1e-4)


# --- block sparse ------------------------------------------------------------------------


def random_layout(rows, cols, seed, p=0.4):
    return torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("n", [1, 37, 130])
@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_block_sparse_equals_dense_with_mask(n, block_size):
    nb = -(-n // block_size)
    layout = random_layout(nb, nb, n * block_size)
    q, k, v = qkv(n, seed=n)
    out = block_sparse_attention(q, k, v, layout, block_size)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, block_size, n))
    assert_same_with_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_local_global_layout(is_causal):
    n, B = 200, 16
    layout = local_global_layout(-(-n // B), 1, 1, is_causal=is_causal)
    q, k, v = qkv(n, batch=(1, 2))
    out = block_sparse_attention(q, k, v, layout, B)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, B, n))
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_rectangular_and_scale():
    q, k, v = qkv(20, j=45, batch=(2,))
    layout = random_layout(3, 6, 1, p=0.6)
    out = block_sparse_attention(q, k, v, layout, 8, scale=0.2)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, 8, (20, 45)), scale=0.2)
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_in_small_steps_gives_the_same_result(monkeypatch):
    monkeypatch.setattr(sparse_module, "_CHUNK_ELEMENTS", 1)
    q, k, v = qkv(50, batch=(1,))
    layout = local_global_layout(7, 1, 1)
    out = block_sparse_attention(q, k, v, layout, 8)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, 8, 50))
    assert_same_with_grads(out, ref, (q, k, v))


def test_block_sparse_fully_masked_rows_are_zero_like_the_reference():
    n, B = 30, 8
    layout = random_layout(4, 4, 3, p=0.7)
    layout[1] = False  # query block 1 attends to nothing
    layout[3] = False  # and the partial last block
    q, k, v = qkv(n, batch=(2,))
    out = block_sparse_attention(q, k, v, layout, B)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, B, n))
    assert (out[..., 8:16, :] == 0).all() and (out[..., 24:, :] == 0).all()
    assert_same_with_grads(out, ref, (q, k, v))
    empty = torch.zeros(4, 4, dtype=torch.bool)
    assert (block_sparse_attention(q, k, v, empty, B) == 0).all()


def test_block_sparse_ignores_poisoned_blocks_no_query_keeps():
    n, B = 45, 8
    layout = random_layout(6, 6, 5, p=0.6)
    layout[:, 2] = False  # no query block keeps key block 2
    q, k, v = (t.detach() for t in qkv(n, batch=(1,)))
    k2, v2 = k.clone(), v.clone()
    k2[..., 16:24, :], v2[..., 16:24, :] = 1e9, 1e9
    a = block_sparse_attention(q, k, v, layout, B)
    b = block_sparse_attention(q, k2, v2, layout, B)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@given(i=st.integers(1, 40), j=st.integers(1, 40), block=st.integers(1, 12), seed=st.integers(0, 10))
def test_block_sparse_property(i, j, block, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(i, 4, generator=g, dtype=torch.float64)
    k, v = torch.randn(j, 4, generator=g, dtype=torch.float64), torch.randn(j, 3, generator=g, dtype=torch.float64)
    layout = random_layout(-(-i // block), -(-j // block), seed)
    out = block_sparse_attention(q, k, v, layout, block)
    ref = scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout, block, (i, j)))
    torch.testing.assert_close(out, ref)


# --- bad input ---------------------------------------------------------------------------


def test_sliding_window_rejects_negative_window():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="window must be >= 0, got -1"):
        sliding_window_attention(q, k, v, window=-1)


def test_sliding_window_rejects_bad_block_size():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        sliding_window_attention(q, k, v, window=1, block_size=0)


def test_sliding_window_needs_self_attention_lengths():
    q, k, v = qkv(5, j=6)
    with pytest.raises(ValueError, match="same number of positions, got 5 and 6"):
        sliding_window_attention(q, k, v, window=1)


def test_sparse_kernels_check_d():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="query and key must share their last dimension d, got 8 and 4"):
        sliding_window_attention(q, k[..., :4], v, window=1)
    with pytest.raises(ValueError, match="query and key must share their last dimension d, got 8 and 4"):
        block_sparse_attention(q, k[..., :4], v, torch.ones(1, 1, dtype=torch.bool), 5)


def test_block_sparse_rejects_bad_block_size():
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        block_sparse_attention(q, k, v, torch.ones(1, 1, dtype=torch.bool), 0)


def test_block_sparse_rejects_layout_shape_mismatch():
    q, k, v = qkv(37)
    with pytest.raises(ValueError, match=r"layout must have shape \(ceil\(i/B\), ceil\(j/B\)\) = \(3, 3\)"):
        block_sparse_attention(q, k, v, torch.ones(2, 2, dtype=torch.bool), 16)


def test_block_sparse_rejects_non_boolean_layout():
    q, k, v = qkv(8)
    with pytest.raises(TypeError, match="layout must be boolean"):
        block_sparse_attention(q, k, v, torch.ones(1, 1), 8)


# --- block sparse, the zero-copy run path (CPU inference) --------------------------------


@pytest.fixture
def run_path_calls(monkeypatch):
    """Count the calls that take the run path (and force it for scattered layouts too)."""
    calls = []
    original = sparse_module._block_sparse_runs

    def spy(*args, **kwargs):
        calls.append(args[3])  # the plan
        return original(*args, **kwargs)

    monkeypatch.setattr(sparse_module, "_block_sparse_runs", spy)
    monkeypatch.setattr(sparse_module, "_MAX_RUN_CALLS_PER_ROW", 10**6)
    return calls


def plain_qkv(i, j=None, *, batch=(2, 3), d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    j = i if j is None else j
    return (torch.randn(*batch, i, d, generator=g, dtype=dtype),
            torch.randn(*batch, j, d, generator=g, dtype=dtype),
            torch.randn(*batch, j, d, generator=g, dtype=dtype))


def reference(q, k, v, layout, B, scale=None):
    mask = block_sparse_mask(layout, B, (q.shape[-2], k.shape[-2]))
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, B, window, num_global", [
    (256, 16, 1, 1), (250, 16, 2, 1), (203, 7, 3, 2), (130, 64, 0, 1), (97, 8, 0, 0), (64, 8, 20, 0),
])
def test_block_sparse_run_path_equals_dense(run_path_calls, dtype, n, B, window, num_global):
    layout = local_global_layout(-(-n // B), window, num_global)
    q, k, v = plain_qkv(n, dtype=dtype, seed=n)
    out = block_sparse_attention(q, k, v, layout, B)
    assert len(run_path_calls) == 1 and out.dtype == dtype and out.shape == (2, 3, n, 8)
    ref = reference(q.double(), k.double(), v.double(), layout, B)
    tol = {} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(out, ref.to(dtype), **tol)
    if dtype == torch.float32:  # and PyTorch's fused kernel with the dense mask
        mask = block_sparse_mask(layout, B, n)
        torch.testing.assert_close(
            out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            atol=1e-5, rtol=1e-4)


def test_block_sparse_run_path_local_global_needs_few_kernel_calls(run_path_calls):
    # band + one global block: row 0, the global column, the band and the last row
    n, B = 32 * 16, 16
    q, k, v = plain_qkv(n, batch=(1,))
    layout = local_global_layout(32, 1, 1)
    torch.testing.assert_close(block_sparse_attention(q, k, v, layout, B), reference(q, k, v, layout, B))
    kinds = [call[0] for call in run_path_calls[0]]
    assert len(kinds) == 4 and kinds.count("shared") == 1


def test_block_sparse_run_path_several_runs_per_row_and_empty_rows(run_path_calls):
    i, j, B = 75, 93, 8  # neither a multiple of B
    layout = torch.zeros(10, 12, dtype=torch.bool)
    layout[:, 0] = True  # a global column
    layout[:, 5:7] = True  # a shared run in the middle
    for r in range(10):
        layout[r, min(11, r + 2):min(12, r + 4)] = True  # a band, clipped at the end
    layout[3, 9:] = True
    layout[4] = False  # a row that attends to nothing
    layout[9] = False  # and the partial last block
    q, k, v = plain_qkv(i, j, seed=1)
    out = block_sparse_attention(q, k, v, layout, B, scale=0.3)
    assert len(run_path_calls) == 1
    assert (out[..., 32:40, :] == 0).all() and (out[..., 72:, :] == 0).all()
    torch.testing.assert_close(out, reference(q, k, v, layout, B, scale=0.3))
    assert (block_sparse_attention(q, k, v, torch.zeros_like(layout), B) == 0).all()


def test_block_sparse_run_path_broadcast_and_strided_inputs(run_path_calls):
    n, B = 90, 8
    layout = local_global_layout(12, 1, 1)
    q, k, v = plain_qkv(n, batch=(2, 3))
    k1, v1 = k[:1], v[:1]  # broadcast over the first batch dim
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride != 1
    out = block_sparse_attention(qt, k1, v1, layout, B)
    torch.testing.assert_close(out, reference(q, k1, v1, layout, B))
    assert len(run_path_calls) == 1


def test_block_sparse_run_path_matches_the_autograd_path():
    n, B = 150, 16
    layout = local_global_layout(10, 2, 1)
    q, k, v = qkv(n, batch=(2,), d=8, e=8)
    with_grad = block_sparse_attention(q, k, v, layout, B)  # the gather path, differentiable
    assert with_grad.requires_grad
    with torch.no_grad():
        fast = block_sparse_attention(q, k, v, layout, B)  # the run path
    assert not fast.requires_grad
    torch.testing.assert_close(fast, with_grad.detach())
    assert_same_with_grads(with_grad, reference(q, k, v, layout, B), (q, k, v))


def test_pad_positions_does_not_copy_without_padding():
    x = torch.randn(2, 8, 3)
    assert sparse_module._pad_positions(x, 0, 0) is x
    assert sparse_module._pad_positions(x, 1, 2).shape == (2, 11, 3)


@given(i=st.integers(1, 60), j=st.integers(1, 60), block=st.integers(1, 12),
       seed=st.integers(0, 20), p=st.floats(0.05, 0.95))
def test_block_sparse_run_path_property(i, j, block, seed, p):
    # any layout through the run path (forced; the gather path usually takes scattered ones)
    limit = sparse_module._MAX_RUN_CALLS_PER_ROW
    sparse_module._MAX_RUN_CALLS_PER_ROW = 10**6
    try:
        q, k, v = plain_qkv(i, j, batch=(2,), d=4, seed=seed)
        layout = random_layout(-(-i // block), -(-j // block), seed, p=p)
        out = block_sparse_attention(q, k, v, layout, block)
    finally:
        sparse_module._MAX_RUN_CALLS_PER_ROW = limit
    torch.testing.assert_close(out, reference(q, k, v, layout, block))


@pytest.mark.parametrize("n", [16 * 12, 16 * 12 - 5])
def test_block_sparse_run_path_column_kept_by_every_row(run_path_calls, n):
    # diagonal + one global block: the global column is cut out of every row, so its one
    # call covers all the queries and its output is the output buffer, merged in place
    B = 12
    layout = local_global_layout(16, 0, 1)
    q, k, v = plain_qkv(n, batch=(3,), seed=n)
    out = block_sparse_attention(q, k, v, layout, B)
    torch.testing.assert_close(out, reference(q, k, v, layout, B))
    plan = run_path_calls[0]
    assert plan[0][:1] == ("shared",) and len(plan[0][1]) == 16 and len(plan) <= 4
    # a middle column kept by every row, next to runs on both sides
    layout = random_layout(16, 16, 2, p=0.3)
    layout[:, 6] = True
    out = block_sparse_attention(q, k, v, layout, B, scale=0.5)
    torch.testing.assert_close(out, reference(q, k, v, layout, B, scale=0.5))
