"""Tests for attention/efficient/_sparse_cpu.py, the CPU fast path of block-sparse
attention.

It must give the dense reference's result for any layout it takes, be the path that
``block_sparse_attention`` takes for CPU inference, and step aside (return ``None``)
wherever it does not apply, including when PyTorch's private op is missing or fails.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attention import (
    block_sparse_attention,
    block_sparse_mask,
    local_global_layout,
    scaled_dot_product_attention,
)
from attention.efficient import _sparse_cpu as cpu


def plain_qkv(i, j=None, *, batch=(2, 3), d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    j = i if j is None else j
    return (
        torch.randn(*batch, i, d, generator=g, dtype=dtype),
        torch.randn(*batch, j, d, generator=g, dtype=dtype),
        torch.randn(*batch, j, d, generator=g, dtype=dtype),
    )


def random_layout(rows, cols, seed, p=0.4):
    return torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < p


def reference(q, k, v, layout, B, scale=None):
    mask = block_sparse_mask(layout, B, (q.shape[-2], k.shape[-2]))
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def runs(q, k, v, layout, B, scale=None):
    """The fast path, forced to take any layout; it must not step aside."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = cpu.block_sparse_runs(q, k, v, layout, B, scale, max_calls_per_row=10**6)
    assert out is not None
    return out


@pytest.fixture
def plans(monkeypatch):
    """The plans that block_sparse_attention ran through the fast path."""
    seen = []
    original = cpu._attend_runs

    def spy(query, key, value, plan, *args):
        seen.append(plan)
        return original(query, key, value, plan, *args)

    monkeypatch.setattr(cpu, "_attend_runs", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "n, B, window, num_global",
    [
        (256, 16, 1, 1),
        (250, 16, 2, 1),
        (203, 7, 3, 2),
        (130, 64, 0, 1),
        (97, 8, 0, 0),
        (64, 8, 20, 0),
    ],
)
def test_fast_path_equals_dense(dtype, n, B, window, num_global):
    layout = local_global_layout(-(-n // B), window, num_global)
    q, k, v = plain_qkv(n, dtype=dtype, seed=n)
    out = runs(q, k, v, layout, B)
    assert out.dtype == dtype and out.shape == (2, 3, n, 8)
    ref = reference(q.double(), k.double(), v.double(), layout, B)
    tol = {} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(out, ref.to(dtype), **tol)
    if dtype == torch.float32:  # and PyTorch's fused kernel with the dense mask
        mask = block_sparse_mask(layout, B, n)
        torch.testing.assert_close(
            out,
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            atol=1e-5,
            rtol=1e-4,
        )


def test_block_sparse_attention_takes_it_for_cpu_inference(plans):
    # band + one global block: row 0, the global column, the band and the last row
    n, B = 32 * 16, 16
    q, k, v = plain_qkv(n, batch=(1,))
    layout = local_global_layout(32, 1, 1)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B)
    torch.testing.assert_close(out, reference(q, k, v, layout, B))
    kinds = [call[0] for call in plans[0]]
    assert len(plans) == 1 and len(kinds) == 4 and kinds.count("shared") == 1


def test_not_taken_with_autograd_masks_or_scattered_layouts(plans):
    n, B = 150, 16
    layout = local_global_layout(10, 2, 1)
    q, k, v = plain_qkv(n, batch=(2,))
    block_sparse_attention(q.requires_grad_(), k, v, layout=layout, block_size=B)
    block_sparse_attention(
        q.detach(), k, v, layout=layout, block_size=B, is_causal=True
    )
    block_sparse_attention(
        q.detach(),
        k,
        v,
        layout=layout,
        block_size=B,
        attn_mask=torch.ones(n, n, dtype=torch.bool),
    )
    scattered = random_layout(
        30, 30, 0, p=0.5
    )  # many short runs: the gather path is faster
    block_sparse_attention(q.detach(), k, v, layout=scattered, block_size=5)
    assert plans == []
    with torch.no_grad():  # inference: taken
        fast = block_sparse_attention(q, k, v, layout=layout, block_size=B)
    assert len(plans) == 1
    torch.testing.assert_close(fast, reference(q.detach(), k, v, layout, B))


@pytest.mark.parametrize("missing", ["absent", "failing"])
def test_falls_back_when_the_private_op_is_missing_or_fails(monkeypatch, missing):
    def broken(*args, **kwargs):
        raise RuntimeError("this build has no such kernel")

    monkeypatch.setattr(cpu, "_FLASH_CPU", None if missing == "absent" else broken)
    n, B = 100, 16
    layout = local_global_layout(7, 1, 1)
    q, k, v = plain_qkv(n, batch=(2,))
    assert cpu.block_sparse_runs(q, k, v, layout, B, 0.3) is None
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B, scale=0.3)
    torch.testing.assert_close(out, reference(q, k, v, layout, B, scale=0.3))


def test_steps_aside_where_it_does_not_apply():
    layout = local_global_layout(4, 1, 1)
    q, k, v = plain_qkv(32, batch=(1,))
    assert cpu.block_sparse_runs(q, k, v[..., :4], layout, 8, 1.0) is None  # e != d
    assert cpu.block_sparse_runs(q.half(), k.half(), v.half(), layout, 8, 1.0) is None
    assert cpu.block_sparse_runs(q.requires_grad_(), k, v, layout, 8, 1.0) is None
    q = q.detach()
    for poison in (float("nan"), -float("inf"), -1e308):  # scores may be non-finite
        k2 = k.clone()
        k2[..., 5, 0] = poison
        assert cpu.block_sparse_runs(q, k2, v, layout, 8, 1.0) is None
    assert cpu.block_sparse_runs(q, k, v, layout, 8, 1.0) is not None


def test_several_runs_per_row_and_empty_rows():
    i, j, B = 75, 93, 8  # neither a multiple of B
    layout = torch.zeros(10, 12, dtype=torch.bool)
    layout[:, 0] = True  # a global column
    layout[:, 5:7] = True  # a shared run in the middle
    for r in range(10):
        layout[r, min(11, r + 2) : min(12, r + 4)] = True  # a band, clipped at the end
    layout[3, 9:] = True
    layout[4] = False  # a row that attends to nothing
    layout[9] = False  # and the partial last block
    q, k, v = plain_qkv(i, j, seed=1)
    out = runs(q, k, v, layout, B, scale=0.3)
    assert (out[..., 32:40, :] == 0).all() and (out[..., 72:, :] == 0).all()
    torch.testing.assert_close(out, reference(q, k, v, layout, B, scale=0.3))
    assert (runs(q, k, v, torch.zeros_like(layout), B) == 0).all()


def test_broadcast_and_strided_inputs():
    n, B = 90, 8
    layout = local_global_layout(12, 1, 1)
    q, k, v = plain_qkv(n, batch=(2, 3))
    k1, v1 = k[:1].expand(2, 3, n, 8), v[:1].expand(2, 3, n, 8)  # broadcast batch dims
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # last-dim stride != 1
    torch.testing.assert_close(
        runs(qt, k1, v1, layout, B), reference(q, k1, v1, layout, B)
    )


@pytest.mark.parametrize("n", [16 * 12, 16 * 12 - 5])
def test_column_kept_by_every_row(plans, n):
    # diagonal + one global block: the global column is cut out of every row, so its one
    # call covers all the queries and its output is the output buffer, merged in place
    B = 12
    layout = local_global_layout(16, 0, 1)
    q, k, v = plain_qkv(n, batch=(3,), seed=n)
    out = block_sparse_attention(q, k, v, layout=layout, block_size=B)
    torch.testing.assert_close(out, reference(q, k, v, layout, B))
    plan = plans[0]
    assert plan[0][:1] == ("shared",) and len(plan[0][1]) == 16 and len(plan) <= 4
    # a middle column kept by every row, next to runs on both sides
    layout = random_layout(16, 16, 2, p=0.3)
    layout[:, 6] = True
    torch.testing.assert_close(
        runs(q, k, v, layout, B, scale=0.5), reference(q, k, v, layout, B, scale=0.5)
    )


def test_large_layouts_are_planned_without_the_cache():
    layout = local_global_layout(300, 1, 1)  # 90 000 blocks: over the cache limit
    before = cpu._plan_cached.cache_info().currsize
    plan = cpu._run_plan(layout, 1, 300, 300)
    assert cpu._plan_cached.cache_info().currsize == before
    assert plan == cpu._plan(layout, 1, 300, 300)


@given(
    i=st.integers(1, 60),
    j=st.integers(1, 60),
    block=st.integers(1, 12),
    seed=st.integers(0, 20),
    p=st.floats(0.05, 0.95),
)
def test_any_layout_property(i, j, block, seed, p):
    q, k, v = plain_qkv(i, j, batch=(2,), d=4, seed=seed)
    layout = random_layout(-(-i // block), -(-j // block), seed, p=p)
    torch.testing.assert_close(
        runs(q, k, v, layout, block), reference(q, k, v, layout, block)
    )
