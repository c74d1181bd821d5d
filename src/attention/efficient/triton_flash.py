r"""FlashAttention-2 as a Triton kernel, forward and backward (chapter 16).

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``d`` query/key/value size.

This module needs the optional dependency Triton (``pip install
'attention-course[triton]'``); the rest of the package never imports it. It is the
algorithm of :func:`attention.tiled_attention` (chapters 14 and 15) written the way a
GPU runs it :cite:`dao2023flashattention2`:

* the **forward** kernel is launched on a grid of ``(query blocks, b·h)`` programs;
  each program keeps one block of queries, its running maximum ``m``, running sum ``l``
  and an unnormalised accumulator in registers, and streams the key/value blocks past
  them (the online softmax). Exponentials are ``exp2`` with :math:`\log_2 e` folded
  into the scale.
  A causal program first visits the key blocks wholly below the diagonal with no mask at
  all, then the diagonal block with the mask. It writes the output and the per-row
  log-sum-exp, nothing of size ``i × j``;
* the **backward** pass is three kernels: the first precomputes
  :math:`D_i = \sum_e dO_{ie} O_{ie}`; the second walks the query blocks for each key
  block to accumulate ``dK`` and ``dV`` (no two programs write the same rows); the
  third walks the key blocks for each query block to accumulate ``dQ``. The
  FlashAttention-2 paper's CUDA kernel instead adds each key block's share of ``dQ``
  into memory with atomic adds. Triton's fused-attention tutorial launches two
  kernels: the same first one, then one whose program does the work of the second and
  third here in turn, for the key block and the query block of its own index; that
  pairing needs as many query blocks as key blocks. Separate launches allow ``i != j``
  and lengths that are not multiples of the block. Like the tutorial's, they recompute
  ``P`` once for ``dK``, ``dV`` and once for ``dQ``, need no atomics, and give a
  result that does not depend on the order in which programs finish.

On CUDA tensors the kernels are compiled; on CPU tensors they run under Triton's
interpreter (what ``TRITON_INTERPRET=1`` selects), which executes the same program with
NumPy, block by block. The interpreter is for checking correctness, not for speed.

``is_causal`` is top-left, as in ``torch.nn.functional.scaled_dot_product_attention``:
query ``q`` sees keys ``k <= q``. :func:`flash_attention_triton` is on the package's
kernel contract but refuses an ``attn_mask`` (boolean, True = may attend, or float): a
mask is what :func:`attention.tiled_attention` takes.

The kernels are public so that chapter 16 can read them: :func:`flash_forward_block`
(the inner step), :func:`flash_forward_kernel`, and the three backward kernels
:func:`flash_backward_delta_kernel`, :func:`flash_backward_dkdv_kernel` and
:func:`flash_backward_dq_kernel`; every launch goes through :func:`kernel_for`. On a
GPU, ``tl.dot`` multiplies float32 inputs in IEEE float32 here
(``input_precision="ieee"``), not in TF32, so the float32 results hold the tolerances
the tests assert.
"""

# A kernel parameter annotated ``tl.constexpr`` is one the compiler specialises on; a
# launch, or a kernel calling another, passes it a plain int, bool or str. Type
# checkers read the marker as a type and report every such argument, so this one rule
# is off in this file (16 findings, all of that kind; every other rule holds).
# pyright: reportArgumentType=false

from __future__ import annotations

import math
import os
import sys

import torch
from torch import Tensor

# Without CUDA the kernels can only run under Triton's interpreter, which must be chosen
# before Triton is first imported (its own library functions are decorated at import).
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError as error:  # pragma: no cover - exercised only without Triton
    raise ImportError(
        "attention.efficient.triton_flash needs Triton: "
        "pip install 'attention-course[triton]'"
    ) from error

from .._checks import check_bool, check_size, validate_attention
from .._core import (
    add_mask,
    attention_scores,
    default_scale,
    expand_kv_heads,
    poisoned_rows,
)
from ..foundations.scaled_dot_product import scaled_dot_product_attention

__all__ = [
    "flash_attention_triton",
    "flash_forward_block",
    "flash_forward_kernel",
    "flash_backward_delta_kernel",
    "flash_backward_dkdv_kernel",
    "flash_backward_dq_kernel",
    "kernel_for",
    "INTERPRETED",
]

_LOG2E = 1.4426950408889634  # log2(e): e^x = 2^(x·log2 e)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------- forward
@triton.jit
def flash_forward_block(
    acc,
    m_i,
    l_i,
    q,
    k_ptrs,
    v_ptrs,
    offs_m,
    offs_n,
    dims_in,
    start_n,
    num_keys,
    stride_kn,
    stride_vn,
    qk_scale,
    MASK_CAUSAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    r"""One step of the online softmax: fold a key/value block into the state.

    The inner step of :func:`flash_forward_kernel`: load the block's keys and
    values, score them against the program's queries (in base-2 units: the scale
    times :math:`\log_2 e`), hide what the causal mask and the sequence end hide,
    raise the running maximum ``m_i``, rescale the running sum ``l_i`` and the
    accumulator ``acc`` by ``alpha``, and add this block's share. Returns the new
    ``(acc, m_i, l_i)``.
    """
    keys_in = (start_n + offs_n) < num_keys
    # rows past the last key and columns past d are not read
    inside = keys_in[:, None] & dims_in[None, :]
    k = tl.load(k_ptrs + start_n * stride_kn, mask=inside, other=0.0)
    v = tl.load(v_ptrs + start_n * stride_vn, mask=inside, other=0.0)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 units
    visible = keys_in[None, :]
    if MASK_CAUSAL:
        visible = visible & (offs_m[:, None] >= (start_n + offs_n)[None, :])
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))  # running maximum
    p = tl.math.exp2(qk - m_new[:, None])  # this block's unnormalised weights
    alpha = tl.math.exp2(m_i - m_new)  # rescales what came before
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def flash_forward_kernel(
    Q,
    K,
    V,
    Out,
    LSE,
    num_queries,
    num_keys,
    head_dim,
    qk_scale,
    stride_qz,
    stride_qm,
    stride_kz,
    stride_kn,
    stride_vz,
    stride_vn,
    stride_oz,
    stride_om,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The forward kernel: one program per (query block ``start_m``, batch·head ``z``).

    The program loads its BLOCK_M queries once, starts the running maximum at ``-inf``
    and the running sum and accumulator at 0, folds in the key/value blocks with
    :func:`flash_forward_block` (causal: the blocks below the diagonal unmasked, then
    the diagonal block masked; the blocks above it are never loaded), divides once, and
    stores the output rows and their log-sum-exp (base 2). Grid:
    ``(cdiv(i, BLOCK_M), b·h)``.
    """
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dims_in = offs_d < head_dim
    rows_in = offs_m < num_queries
    q = tl.load(
        Q + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=rows_in[:, None] & dims_in[None, :],
        other=0.0,
    )
    k_ptrs = K + z * stride_kz + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + z * stride_vz + offs_n[:, None] * stride_vn + offs_d[None, :]
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if IS_CAUSAL:
        # 1. key blocks before the program's first row: all seen, no mask
        below = tl.minimum(start_m * BLOCK_M, num_keys)
        for start_n in range(0, below, BLOCK_N):
            acc, m_i, l_i = flash_forward_block(
                acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, dims_in,
                start_n, num_keys, stride_kn, stride_vn, qk_scale,
                False, BLOCK_N, PRECISION,
            )  # fmt: skip
        # 2. the diagonal block (one block: the launcher makes BLOCK_M == BLOCK_N)
        diagonal_end = tl.minimum((start_m + 1) * BLOCK_M, num_keys)
        for start_n in range(below, diagonal_end, BLOCK_N):
            acc, m_i, l_i = flash_forward_block(
                acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, dims_in,
                start_n, num_keys, stride_kn, stride_vn, qk_scale,
                True, BLOCK_N, PRECISION,
            )  # fmt: skip
    else:
        for start_n in range(0, num_keys, BLOCK_N):
            acc, m_i, l_i = flash_forward_block(
                acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_m, offs_n, dims_in,
                start_n, num_keys, stride_kn, stride_vn, qk_scale,
                False, BLOCK_N, PRECISION,
            )  # fmt: skip
    acc = acc / l_i[:, None]  # the one division, at the end
    tl.store(LSE + z * num_queries + offs_m, m_i + tl.math.log2(l_i), mask=rows_in)
    tl.store(
        Out + z * stride_oz + offs_m[:, None] * stride_om + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=rows_in[:, None] & dims_in[None, :],
    )


# --------------------------------------------------------------------------- backward
@triton.jit
def flash_backward_delta_kernel(
    Out,
    DO,
    DELTA,
    num_queries,
    head_dim,
    stride_oz,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Backward, kernel 1: ``D_i = rowsum(dO ∘ O)``, the term every ``dS_ij`` of row
    ``i`` subtracts. One program per (query block, batch·head)."""
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    inside = (offs_m < num_queries)[:, None] & (offs_d < head_dim)[None, :]
    offsets = z * stride_oz + offs_m[:, None] * stride_om + offs_d[None, :]
    o = tl.load(Out + offsets, mask=inside, other=0.0).to(tl.float32)
    do = tl.load(DO + offsets, mask=inside, other=0.0).to(tl.float32)
    tl.store(
        DELTA + z * num_queries + offs_m, tl.sum(o * do, 1), mask=offs_m < num_queries
    )


@triton.jit
def flash_backward_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    num_queries,
    num_keys,
    head_dim,
    scale,
    qk_scale,
    stride_qz,
    stride_qm,
    stride_kz,
    stride_kn,
    stride_vz,
    stride_vn,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Backward, kernel 2: one program per (key block ``start_n``, batch·head ``z``).

    Walks the query blocks that can see the key block, recomputes ``P`` from the saved
    log-sum-exp and accumulates ``dV += Pᵀ dO`` and ``dK += dSᵀ Q`` for its BLOCK_N
    keys: no other program writes those rows.
    """
    start_n = tl.program_id(0)
    z = tl.program_id(1)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dims_in = offs_d < head_dim
    keys_in = offs_n < num_keys
    kv_mask = keys_in[:, None] & dims_in[None, :]
    k = tl.load(
        K + z * stride_kz + offs_n[:, None] * stride_kn + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        V + z * stride_vz + offs_n[:, None] * stride_vn + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # a causal key block is seen only by queries at or after its first key
    first = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if IS_CAUSAL else 0
    for start_m in range(first, num_queries, BLOCK_M):
        rows = start_m + offs_m
        rows_in = rows < num_queries
        q_mask = rows_in[:, None] & dims_in[None, :]
        q = tl.load(
            Q + z * stride_qz + rows[:, None] * stride_qm + offs_d[None, :],
            mask=q_mask,
            other=0.0,
        )
        do = tl.load(
            DO + z * stride_qz + rows[:, None] * stride_qm + offs_d[None, :],
            mask=q_mask,
            other=0.0,
        )
        lse = tl.load(LSE + z * num_queries + rows, mask=rows_in, other=0.0)
        delta = tl.load(DELTA + z * num_queries + rows, mask=rows_in, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # log2
        visible = keys_in[:, None] & rows_in[None, :]
        if IS_CAUSAL:
            visible = visible & (rows[None, :] >= offs_n[:, None])
        # P, recomputed from the saved log-sum-exp
        p_t = tl.where(visible, tl.math.exp2(qk_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
    tl.store(
        DK + z * stride_kz + offs_n[:, None] * stride_kn + offs_d[None, :],
        (dk * scale).to(DK.dtype.element_ty),
        mask=kv_mask,
    )
    tl.store(
        DV + z * stride_vz + offs_n[:, None] * stride_vn + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=kv_mask,
    )


@triton.jit
def flash_backward_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    num_queries,
    num_keys,
    head_dim,
    scale,
    qk_scale,
    stride_qz,
    stride_qm,
    stride_kz,
    stride_kn,
    stride_vz,
    stride_vn,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Backward, kernel 3: one program per (query block ``start_m``, batch·head ``z``).

    The mirror image of :func:`flash_backward_dkdv_kernel`: walks the key blocks its
    queries can see and accumulates ``dQ += dS K`` for its BLOCK_M queries.
    """
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dims_in = offs_d < head_dim
    rows_in = offs_m < num_queries
    q_mask = rows_in[:, None] & dims_in[None, :]
    q = tl.load(
        Q + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=q_mask,
        other=0.0,
    )
    do = tl.load(
        DO + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=q_mask,
        other=0.0,
    )
    lse = tl.load(LSE + z * num_queries + offs_m, mask=rows_in, other=0.0)
    delta = tl.load(DELTA + z * num_queries + offs_m, mask=rows_in, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum((start_m + 1) * BLOCK_M, num_keys) if IS_CAUSAL else num_keys
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + offs_n
        keys_in = cols < num_keys
        kv_mask = keys_in[:, None] & dims_in[None, :]
        k = tl.load(
            K + z * stride_kz + cols[:, None] * stride_kn + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            V + z * stride_vz + cols[:, None] * stride_vn + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = rows_in[:, None] & keys_in[None, :]
        if IS_CAUSAL:
            visible = visible & (offs_m[:, None] >= cols[None, :])
        p = tl.where(visible, tl.math.exp2(qk - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(
        DQ + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=q_mask,
    )


# ----------------------------------------------------------------------------- launch
INTERPRETED = isinstance(tl.sum, InterpretedFunction)
"""True when the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``)."""
if (
    isinstance(flash_forward_kernel, InterpretedFunction) != INTERPRETED
):  # pragma: no cover
    raise ImportError(
        "Triton was first imported with another TRITON_INTERPRET setting than this "
        "module's kernels see: its own library functions are compiled and these "
        "kernels interpreted, or the reverse. Set TRITON_INTERPRET=1 (on a machine "
        "without CUDA) before anything imports triton, e.g. at the top of the script "
        "or in the shell, and restart."
    )


def kernel_for(kernel, device: torch.device):
    """The kernel to launch on ``device``: ``kernel_for(k, device)[grid](*args)``.

    Every launch of the module goes through it (a wrapper in its place sees each grid).
    On CUDA the kernel is compiled; CPU tensors need Triton's interpreter, and a
    ``ValueError`` says how to turn it on when it is off.
    """
    if device.type == "cpu" and not INTERPRETED:
        raise ValueError(
            "CPU tensors run only under Triton's interpreter: set "
            "TRITON_INTERPRET=1 before anything imports triton, or use CUDA tensors"
        )
    return kernel


def _block(device: torch.device, block_size: int | None, i: int, j: int) -> int:
    """The block size: given or 64 on CUDA, 16 on the interpreter; never past the
    sequence (a block larger than the longer of ``i`` and ``j``, rounded up to a power
    of two, would only compute padding)."""
    block = (
        block_size if block_size is not None else 64 if device.type == "cuda" else 16
    )
    return min(block, max(16, triton.next_power_of_2(max(i, j))))


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: "ieee" for float32, which NVIDIA GPUs would
    otherwise multiply in TF32 (10-bit mantissas: errors near 1e-3 against float64);
    float16 and bfloat16 products are exact on the tensor cores either way. (The
    interpreter computes in NumPy and ignores the setting.)"""
    return "ieee" if dtype == torch.float32 else "tf32"


class _FlashAttentionTriton(torch.autograd.Function):
    """Forward keeps q, k, v, o and the log2-sum-exp; backward rebuilds P from them."""

    @staticmethod
    def forward(ctx, query, key, value, is_causal, scale, block):
        *lead, num_queries, head_dim = query.shape
        num_keys = key.shape[-2]
        q = query.reshape(-1, num_queries, head_dim).contiguous()  # (b·h, i, d)
        k = key.reshape(-1, num_keys, head_dim).contiguous()  # (b·h, j, d)
        v = value.reshape(-1, num_keys, head_dim).contiguous()  # (b·h, j, d)
        z = q.shape[0]
        out = torch.empty_like(q)
        lse = torch.empty(z, num_queries, device=q.device, dtype=torch.float32)
        block_d = max(16, triton.next_power_of_2(head_dim))
        precision = _precision(q.dtype)
        grid = (triton.cdiv(num_queries, block), z)
        kernel_for(flash_forward_kernel, q.device)[grid](
            q,
            k,
            v,
            out,
            lse,
            num_queries,
            num_keys,
            head_dim,
            scale * _LOG2E,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            out.stride(0),
            out.stride(1),
            IS_CAUSAL=is_causal,
            BLOCK_M=block,
            BLOCK_N=block,
            BLOCK_D=block_d,
            PRECISION=precision,
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.shape, ctx.is_causal, ctx.scale, ctx.block = (
            query.shape,
            is_causal,
            scale,
            block,
        )
        return out.reshape(query.shape), (lse / _LOG2E).reshape(*lead, num_queries)

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        z, num_queries, head_dim = q.shape
        num_keys = k.shape[1]
        block = ctx.block
        block_d = max(16, triton.next_power_of_2(head_dim))
        do = dout.reshape(z, num_queries, head_dim).contiguous()
        delta = torch.empty(z, num_queries, device=q.device, dtype=torch.float32)
        kernel_for(flash_backward_delta_kernel, q.device)[
            (triton.cdiv(num_queries, block), z)
        ](
            out,
            do,
            delta,
            num_queries,
            head_dim,
            out.stride(0),
            out.stride(1),
            BLOCK_M=block,
            BLOCK_D=block_d,
        )
        if dlse is not None:
            # L = log-sum-exp of the row; dL/dS_ij = P_ij, so it adds to dS as dO·V
            # does
            delta = delta - dlse.reshape(z, num_queries).to(torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        strides = (
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
        )
        common = dict(
            IS_CAUSAL=ctx.is_causal,
            BLOCK_M=block,
            BLOCK_N=block,
            BLOCK_D=block_d,
            PRECISION=_precision(q.dtype),
        )
        kernel_for(flash_backward_dkdv_kernel, q.device)[
            (triton.cdiv(num_keys, block), z)
        ](
            q,
            k,
            v,
            do,
            lse,
            delta,
            dk,
            dv,
            num_queries,
            num_keys,
            head_dim,
            ctx.scale,
            ctx.scale * _LOG2E,
            *strides,
            **common,
        )
        kernel_for(flash_backward_dq_kernel, q.device)[
            (triton.cdiv(num_queries, block), z)
        ](
            q,
            k,
            v,
            do,
            lse,
            delta,
            dq,
            num_queries,
            num_keys,
            head_dim,
            ctx.scale,
            ctx.scale * _LOG2E,
            *strides,
            **common,
        )
        shape = ctx.shape
        return (
            dq.reshape(shape),
            dk.reshape(*shape[:-2], num_keys, head_dim),
            dv.reshape(*shape[:-2], num_keys, head_dim),
            None,
            None,
            None,
        )


def _validate(
    query, key, value, attn_mask, is_causal, scale, enable_gqa, block_size, return_lse
) -> torch.Size:
    """The contract's checks, then what the kernels need; returns the scores' shape."""
    scores_shape = validate_attention(
        query, key, value, attn_mask, is_causal, scale, enable_gqa
    )
    check_bool("return_lse", return_lse)
    if attn_mask is not None:
        raise ValueError(
            "flash_attention_triton takes no attn_mask: its kernels apply only the "
            "causal mask (is_causal=True); a boolean or float mask is for "
            "tiled_attention, which runs the same recurrence in PyTorch"
        )
    if query.dtype not in _DTYPES:
        raise TypeError(
            "query, key and value must be float16, bfloat16 or float32 (the types "
            f"Triton's tl.dot multiplies), got {query.dtype}"
        )
    if query.device.type not in ("cpu", "cuda"):
        raise ValueError(
            "query, key and value must be on the CPU (Triton's interpreter) or a CUDA "
            f"device, got {query.device}"
        )
    if INTERPRETED and query.dtype == torch.bfloat16:
        raise TypeError(
            "Triton's interpreter computes with NumPy, which has no bfloat16: "
            "use float16 or float32 on the CPU, bfloat16 on a CUDA device"
        )
    if block_size is not None:
        block_size = check_size("block_size", block_size, minimum=16)
        if block_size > 256 or block_size & (block_size - 1):
            raise ValueError(
                "block_size must be a power of two from 16 (tl.dot's smallest tile) to "
                "256 (a block_size × block_size tile of scores lives in registers and "
                f"on-chip memory), got {block_size}"
            )
    d, e = query.shape[-1], value.shape[-1]
    if scores_shape[-1] and scores_shape[-2] and d:  # what the kernels will see
        if e != d:
            raise ValueError(
                "the kernels need one size d for query, key and value, got "
                f"d = {d} and e = {e}"
            )
        if d > 256:
            raise ValueError(f"the head size d must be at most 256, got {d}")
    return scores_shape


def _nothing_to_compute(query, key, value, is_causal, scale, enable_gqa, return_lse):
    """``i``, ``j`` or ``d`` is 0: the dense reference, which handles these as torch
    does (no key: zeros; ``d = 0``: zero scores, the mean of the visible values)."""
    out = scaled_dot_product_attention(
        query, key, value, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    if not return_lse:
        return out
    scores, mask = attention_scores(query, key, None, is_causal, scale, enable_gqa)
    scores = scores if mask is None else add_mask(scores, mask)
    return out, torch.logsumexp(scores.float(), dim=-1)  # (..., h, i), -inf for j = 0


def flash_attention_triton(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    block_size: int | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact attention by the FlashAttention-2 Triton kernels, differentiable.

    .. math::

        \operatorname{out} = \operatorname{softmax}(s\, Q K^\top)\, V,
        \qquad s = 1/\sqrt{d} \text{ unless } \texttt{scale} \text{ is given}.

    Equal, up to rounding, to :func:`attention.tiled_attention` and to
    ``torch.nn.functional.scaled_dot_product_attention`` with the same arguments; the
    ``(i, j)`` weights are never stored, in the forward or the backward pass. On the
    kernel contract of the package: batch dims broadcast, grouped-query heads are
    repeated before the kernels, and a NaN or ``+inf`` score against a key the causal
    kernels skip still makes its row NaN, as in the dense reference.

    Args:
        query: ``(..., h, i, d)``, e.g. ``(b, h, i, d)``; float16, bfloat16 (CUDA
            only) or float32.
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, d)``: the kernels need ``e = d``.
        attn_mask: must be None: the kernels apply only the causal mask, and a
            ``ValueError`` says so. A boolean mask (True = may attend) or a float one is
            for :func:`attention.tiled_attention`.
        is_causal: top-left causal mask (query ``q`` sees keys ``k <= q``), as in
            torch's SDPA.
        scale: multiplies the scores; ``None`` means ``1/sqrt(d)``. Any real number, NaN
            included (it propagates, as in torch).
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        block_size: rows per query block and per key block, a power of two from 16 to
            256; ``None`` picks 64 on CUDA and 16 on the CPU interpreter. A block longer
            than the sequence is cut to it.
        return_lse: also return the natural log-sum-exp of each row's scaled scores.

    Returns:
        ``(..., h, i, d)``, and ``(..., h, i)`` float32 log-sum-exp when ``return_lse``.

    Example:
        >>> import torch
        >>> from attention.efficient.triton_flash import flash_attention_triton
        >>> q, k, v = torch.randn(3, 1, 2, 20, 16).unbind(0)
        >>> out = flash_attention_triton(q, k, v, is_causal=True)
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> ref = sdpa(q, k, v, is_causal=True)
        >>> torch.allclose(out, ref, atol=1e-5)
        True
    """
    scores_shape = _validate(
        query,
        key,
        value,
        attn_mask,
        is_causal,
        scale,
        enable_gqa,
        block_size,
        return_lse,
    )
    *lead, i, j = scores_shape
    if min(i, j, query.shape[-1]) == 0:
        return _nothing_to_compute(
            query, key, value, is_causal, scale, enable_gqa, return_lse
        )
    scale = default_scale(scale, query.shape[-1])
    q, k, v = query, key, value
    if enable_gqa:
        k = expand_kv_heads(key, query.shape[-3])  # (..., h, j, d)
        v = expand_kv_heads(value, query.shape[-3])
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))  # broadcast batch
    block = _block(query.device, block_size, i, j)
    out, lse = _FlashAttentionTriton.apply(q, k, v, is_causal, scale, block)
    bad = poisoned_rows(query, key, scale, enable_gqa)  # e.g. +inf in a skipped block
    if bad is not None:
        out = out.masked_fill(bad, math.nan)
        lse = lse.masked_fill(bad.squeeze(-1), math.nan)
    return (out, lse) if return_lse else out
