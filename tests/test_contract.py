"""One suite for every function on the kernel contract.

``f(query, key, value, *, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
<own options>)`` with query ``(..., h, i, d)``, key ``(..., h_kv, j, d)``, value
``(..., h_kv, j, e)``; boolean masks with True = may attend. Each kernel is listed once
with what it can do; every test runs over every kernel that can do what it tests:
validation messages, refusals of what a kernel cannot honour, rows with no visible key
(zero output, finite gradients), NaN propagation, no keys at all (``j = 0``), masks that
broadcast over every axis torch accepts, and equality with torch's
``scaled_dot_product_attention`` (or the kernel's own reference: :func:`_dense` below
writes a softmax or sigmoid variant as "scores → modify → normalise → @ value").

The Triton kernel joins the table when Triton is installed (under its interpreter on a
CPU), ring attention in a one-process gloo group. The recurrent family
(``initial_state``, ``output_final_state``, ``chunk_size``) has a table of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attention import (
    apply_rope,
    attention_with_sinks,
    block_sparse_attention,
    dual_chunk_attention,
    lightning_attention,
    linear_attention,
    linformer_attention,
    lsh_attention,
    scaled_dot_product_attention,
    sigmoid_attention,
    sliding_window_attention,
    tiled_attention,
)
from attention.efficient.distributed import ring_attention
from attention.efficient.linear import linear_attention_naive
from attention.practice.logits import softcap_attention
from conftest import qkv

try:
    from attention.efficient.triton_flash import flash_attention_triton
except ImportError:  # the optional dependency triton is not installed
    flash_attention_triton = None

F64 = torch.float64


def _torch(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


def _softmax_rows(s):
    """Softmax over the keys; a row with no visible key (all -inf) gets zeros."""
    dead = torch.isneginf(s).all(-1, keepdim=True)
    return torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)


def _dense(
    q,
    k,
    v,
    attn_mask=None,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    score_mod=None,
    normalise=_softmax_rows,
):
    """An independent dense reference: scores → score_mod → mask → normalise → @ v."""
    if enable_gqa:
        r = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(r, -3), v.repeat_interleave(r, -3)
    d = q.shape[-1]
    factor = 1.0 if d == 0 else d**-0.5 if scale is None else scale  # torch's rule
    s = (q @ k.transpose(-2, -1)) * factor
    if score_mod is not None:
        s = score_mod(s)
    if is_causal:
        attn_mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=s.dtype).masked_fill(
            ~attn_mask, -math.inf
        )
    if attn_mask is not None:
        s = s + attn_mask.to(s.dtype)
    return normalise(s) @ v


CAP = 2.0


def _softcap_reference(q, k, v, **kw):
    return _dense(q, k, v, score_mod=lambda s: CAP * torch.tanh(s / CAP), **kw)


def _sigmoid_reference(q, k, v, **kw):
    bias = -math.log(k.shape[-2]) if k.shape[-2] else 0.0
    return _dense(q, k, v, score_mod=lambda s: s + bias, normalise=torch.sigmoid, **kw)


def _lightning_reference(q, k, v, *, scale=None, **kw):
    d = q.shape[-1]
    s = 1.0 if d == 0 else d**-0.5 if scale is None else scale
    kw = {"is_causal": True, **kw}
    return linear_attention(s * q, k, v, normalize=False, feature_map=lambda x: x, **kw)


def _ring(q, k, v, **kw):
    """Ring attention in a one-process gloo group (the ring has one step)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return ring_attention(q, k, v, block_size=2, **kw)
    finally:
        dist.destroy_process_group()


def _causal_and(mask, i, j):
    causal = torch.ones(i, j, dtype=torch.bool).tril(
        j - i
    )  # the queries are the last i positions
    if mask is None:
        return causal
    return (
        mask & causal
        if mask.dtype == torch.bool
        else mask.masked_fill(~causal, -torch.inf)
    )


@dataclass
class Kernel:
    name: str
    call: object  # (q, k, v, **contract options) -> output
    reference: object = _torch  # the same on the dense path
    mask: bool = True  # honours attn_mask
    causal: bool = True  # honours is_causal=True
    non_causal: bool = True  # honours is_causal=False
    scale: bool = True  # honours scale
    shared_qk: bool = False  # needs query is key (Reformer)
    square: bool = False  # causal self-attention only: i = j
    exact: bool = True  # equals the reference to rounding
    bounded_scores: bool = False  # its score_mod turns a +inf score finite (soft cap)
    dtype: torch.dtype = F64  # the inputs the tests give it
    same_size: bool = False  # needs e = d
    tol: dict = field(default_factory=dict)
    interpreted: bool = False  # a Triton kernel, run by Triton's interpreter on a CPU


def _block_sparse(q, k, v, **kw):
    B = 2
    i = getattr(q, "shape", k.shape)[-2]  # the validation tests pass a list as query
    layout = torch.ones(-(-i // B), -(-k.shape[-2] // B), dtype=torch.bool)
    return block_sparse_attention(q, k, v, layout=layout, block_size=B, **kw)


def _sinks(q, k, v, **kw):  # sinks that take no weight: plain attention
    h = getattr(q, "shape", k.shape)[-3]
    return attention_with_sinks(
        q, k, v, torch.full((h,), -torch.inf, dtype=k.dtype), **kw
    )


def _dual_chunk(q, k, v, **kw):
    return dual_chunk_attention(q, k, v, chunk_size=64, **{"is_causal": True, **kw})


def _dual_chunk_reference(q, k, v, attn_mask=None, is_causal=True, **kw):
    # fewer positions than one chunk: plain causal RoPE attention
    i, j = q.shape[-2], k.shape[-2]
    qr = apply_rope(q, torch.arange(j - i, j))
    mask = _causal_and(attn_mask, i, j)
    return _torch(qr, apply_rope(k), v, attn_mask=mask, **kw)


def _linformer(q, k, v, **kw):
    j = k.shape[-2]
    g = torch.Generator().manual_seed(3)
    e_proj = torch.randn(3, j, generator=g, dtype=k.dtype)
    return linformer_attention(
        q, k, v, key_projection=e_proj, value_projection=e_proj.flip(0), **kw
    )


def _linformer_reference(q, k, v, **kw):
    j = k.shape[-2]
    g = torch.Generator().manual_seed(3)
    e_proj = torch.randn(3, j, generator=g, dtype=q.dtype)
    return _torch(q, e_proj @ k, e_proj.flip(0) @ v, **kw)


def _lsh(q, k, v, **kw):
    return lsh_attention(
        k,
        k,
        v,
        num_buckets=2,
        chunk_size=4,
        generator=torch.Generator().manual_seed(0),
        **kw,
    )


KERNELS = [
    Kernel("scaled_dot_product_attention", scaled_dot_product_attention),
    Kernel("tiled_attention", partial(tiled_attention, block_size=3)),
    Kernel(
        "sliding_window_attention",
        partial(sliding_window_attention, window=1000, block_size=2),
    ),
    Kernel("block_sparse_attention", _block_sparse),
    Kernel("attention_with_sinks", _sinks),
    Kernel(
        "dual_chunk_attention", _dual_chunk, _dual_chunk_reference, non_causal=False
    ),
    Kernel(
        "linear_attention",
        linear_attention,
        lambda q, k, v, **kw: linear_attention_naive(q, k, v, **kw),
        mask=False,
        scale=False,
    ),
    Kernel(
        "linformer_attention",
        _linformer,
        _linformer_reference,
        mask=False,
        causal=False,
    ),
    Kernel("lsh_attention", _lsh, mask=False, shared_qk=True, exact=False),
    Kernel(
        "softcap_attention",
        partial(softcap_attention, cap=CAP),
        _softcap_reference,
        bounded_scores=True,
    ),
    Kernel("sigmoid_attention", sigmoid_attention, _sigmoid_reference),
    Kernel(
        "lightning_attention",
        partial(lightning_attention, block_size=4),
        _lightning_reference,
        mask=False,
        non_causal=False,
        square=True,
    ),
    Kernel("ring_attention", _ring, mask=False),
]
if flash_attention_triton is not None:
    KERNELS.append(
        Kernel(
            "flash_attention_triton",
            flash_attention_triton,
            mask=False,
            dtype=torch.float32,
            same_size=True,
            tol={"atol": 2e-5, "rtol": 1e-5},
            interpreted=True,
        )
    )
IDS = [k.name for k in KERNELS]


def _kernels(*, runs_kernels=False, **needs):
    """The kernels with the properties ``needs``; with ``runs_kernels``, a test that
    runs an interpreted kernel forward and backward (about half a second a case) is
    slow: make test, not make check."""
    return [
        pytest.param(
            k,
            id=k.name,
            marks=[pytest.mark.slow] if runs_kernels and k.interpreted else [],
        )
        for k in KERNELS
        if all(getattr(k, a) == v for a, v in needs.items())
    ]


def _inputs(kernel, i=5, j=7, h=4, h_kv=None, grad=False, **kw):
    if kernel.shared_qk or kernel.square:
        j = i
    elif not kernel.non_causal:
        j = max(i, j)
    e = 4 if kernel.same_size else 3
    q, k, v = qkv(
        i, j, batch=(2,), h=h, h_kv=h_kv, d=4, e=e, grad=grad, dtype=kernel.dtype, **kw
    )
    return q, k, v


def _opts(kernel, **kw):
    return kw if kernel.non_causal else {"is_causal": True, **kw}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kernel", _kernels())
def test_validation_messages_name_the_rule(kernel):
    q, k, v = _inputs(kernel, i=4, j=4)
    if not kernel.shared_qk:
        with pytest.raises(TypeError, match="query must be a torch.Tensor"):
            kernel.call(q.tolist(), k, v, **_opts(kernel))
    with pytest.raises(TypeError, match="floating"):
        kernel.call(q.long(), k.long() if kernel.shared_qk else k, v, **_opts(kernel))
    other = torch.float16 if q.dtype != torch.float16 else torch.float32
    with pytest.raises((TypeError, ValueError), match="dtype"):
        kernel.call(q, k, v.to(other), **_opts(kernel))
    if not kernel.shared_qk:
        with pytest.raises(ValueError, match=r"\bd\b"):
            kernel.call(q, k[..., :3], v, **_opts(kernel))
    with pytest.raises(ValueError, match=r"\bj\b|rows? per key|positions"):
        kernel.call(q, k, v[..., :3, :], **_opts(kernel))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        kernel.call(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        kernel.call(q, k, v, enable_gqa="yes", **_opts(kernel))
    if kernel.scale:
        with pytest.raises(TypeError, match="scale"):
            kernel.call(q, k, v, scale="big", **_opts(kernel))
    if kernel.mask:
        with pytest.raises(ValueError, match="attn_mask"):
            kernel.call(
                q, k, v, attn_mask=torch.ones(3, 3, dtype=torch.bool), **_opts(kernel)
            )
        with pytest.raises(TypeError, match="attn_mask"):
            kernel.call(
                q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.long), **_opts(kernel)
            )


@pytest.mark.parametrize("kernel", _kernels())
def test_grouped_query_heads_must_divide(kernel):
    if kernel.shared_qk:
        pytest.skip("query is key: one head count")
    q, k, v = _inputs(kernel, h=4, h_kv=3)
    with pytest.raises(ValueError, match="multiple"):
        kernel.call(q, k, v, enable_gqa=True, **_opts(kernel))


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_refuses_what_it_cannot_honour_and_says_why(kernel):
    q, k, v = _inputs(kernel, i=4, j=4)
    if not kernel.mask:
        with pytest.raises(ValueError, match="attn_mask"):
            kernel.call(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    if not kernel.causal:
        with pytest.raises(ValueError, match="is_causal"):
            kernel.call(q, k, v, is_causal=True)
    if not kernel.non_causal:
        with pytest.raises(
            ValueError, match=r"is_causal must be True|is_causal=True\)"
        ):
            kernel.call(q, k, v, is_causal=False)
    if not kernel.scale:
        with pytest.raises(ValueError, match="scale"):
            kernel.call(q, k, v, scale=0.5)
    if kernel.mask and kernel.causal and kernel.non_causal:
        with pytest.raises(
            ValueError, match="attn_mask.*is_causal|is_causal.*attn_mask"
        ):
            kernel.call(
                q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool), is_causal=True
            )


# ----------------------------------------------------------------------------- results


@pytest.mark.parametrize("kernel", _kernels(exact=True, runs_kernels=True))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h_kv", [4, 2, 1])
def test_equals_its_dense_reference_with_gradients(kernel, causal, h_kv):
    if (causal and not kernel.causal) or (not causal and not kernel.non_causal):
        pytest.skip("not on this kernel")
    q, k, v = _inputs(kernel, i=6, j=6, h_kv=h_kv, grad=True)
    opts = {"is_causal": causal, "enable_gqa": h_kv != 4}
    out, ref = kernel.call(q, k, v, **opts), kernel.reference(q, k, v, **opts)
    torch.testing.assert_close(out, ref, **kernel.tol)
    w = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), w), torch.autograd.grad(ref, (q, k, v), w)
    ):
        torch.testing.assert_close(a, b, **kernel.tol)


MASK_SHAPES = [
    (6, 7),
    (1, 7),
    (6, 1),
    (1, 1),
    (4, 6, 7),
    (4, 1, 1),
    (1, 6, 1),
    (2, 1, 1, 1),
    (2, 4, 6, 7),
    (1, 4, 1, 7),
    (2, 1, 6, 1),
    (1, 1, 1, 1),
]


@pytest.mark.parametrize("kernel", _kernels(mask=True))
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_broadcast_over_every_axis_torch_accepts(kernel, shape, kind):
    q, k, v = _inputs(kernel, i=6, j=7, h_kv=2, grad=True)
    i, j = q.shape[-2], k.shape[-2]
    shape = tuple(j if s == 7 else s for s in shape)
    g = torch.Generator().manual_seed(sum(shape))
    mask = (
        torch.rand(shape, generator=g) > 0.3
        if kind == "bool"
        else torch.randn(shape, generator=g, dtype=F64)
    )
    out = kernel.call(q, k, v, attn_mask=mask, enable_gqa=True, **_opts(kernel))
    ref = kernel.reference(q, k, v, attn_mask=mask, enable_gqa=True, **_opts(kernel))
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), w), torch.autograd.grad(ref, (q, k, v), w)
    ):
        torch.testing.assert_close(a, b)
    assert i == q.shape[-2]


@pytest.mark.parametrize("kernel", _kernels(mask=True))
def test_a_row_with_no_visible_key_is_zero_with_finite_gradients(kernel):
    q, k, v = _inputs(kernel, i=6, j=6, grad=True)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[4] = False  # query 4 sees nothing
    out = kernel.call(q, k, v, attn_mask=mask, **_opts(kernel))
    assert (out[..., 4, :] == 0).all()
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][..., 4, :] == 0).all()


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_nan_in_a_query_propagates_to_its_row_only(kernel):
    q, k, v = _inputs(kernel, i=6, j=6)
    if (
        kernel.shared_qk
    ):  # query is key: a NaN key reaches other rows, so poison a value row's query
        pytest.skip("query is key: a NaN query is also a NaN key")
    q = q.clone()
    q[0, 1, 2, 0] = float("nan")
    out = kernel.call(q, k, v, **_opts(kernel))
    assert out[0, 1, 2].isnan().all()
    rest = torch.ones(out.shape[:-1], dtype=torch.bool)
    rest[0, 1, 2] = False
    assert not out[rest].isnan().any()


@pytest.mark.parametrize("kernel", _kernels(exact=True, mask=True))
@pytest.mark.parametrize("poison", [math.inf, math.nan])
def test_a_masked_key_holding_inf_makes_rows_nan_as_in_the_reference(kernel, poison):
    """The package's one rule for non-finite scores (torch's): a NaN or +inf score
    poisons its row even against a masked key (a soft cap turns +inf into the cap: no
    NaN)."""
    q, k, v = _inputs(kernel, i=6, j=6)
    q, k = q.clone(), k.clone()
    q[..., 0] = 1.0
    k[..., 5, 0] = poison
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[:, 5] = False
    out = kernel.call(q, k, v, attn_mask=mask, **_opts(kernel))
    ref = kernel.reference(q, k, v, attn_mask=mask, **_opts(kernel))
    torch.testing.assert_close(out, ref, equal_nan=True)
    if not (kernel.bounded_scores and poison == math.inf):
        assert out.isnan().any()  # (every row, unless RoPE turns some scores to -inf)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, attn_mask=mask),
        _torch(q, k, v, attn_mask=mask),
        equal_nan=True,
    )


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_no_keys_gives_zeros(kernel):
    i = 0 if (kernel.shared_qk or kernel.square or not kernel.non_causal) else 3
    q, k, v = qkv(i, 0, batch=(2,), h=2, d=4, e=3, grad=True, dtype=kernel.dtype)
    out = kernel.call(q, k, v, **_opts(kernel))
    assert out.shape == (2, 2, i, 3) and (out == 0).all()
    if i:
        (gq,) = torch.autograd.grad(out.sum(), (q,))
        assert (gq == 0).all()


@pytest.mark.parametrize("kernel", _kernels(exact=True))
def test_zero_size_features_ignore_the_scale_as_torch(kernel):
    if not kernel.scale:
        pytest.skip("no scale")
    q, k, v = _inputs(kernel, i=4, j=4)
    q, k = q[..., :0], k[..., :0]
    if kernel.name == "dual_chunk_attention":
        pytest.skip("RoPE needs features")
    for scale in (None, float("nan"), 2.0):
        out = kernel.call(q, k, v, scale=scale, **_opts(kernel))
        torch.testing.assert_close(
            out, kernel.reference(q, k, v, scale=scale, **_opts(kernel)), **kernel.tol
        )
        assert (
            torch.isfinite(out).all()
            and torch.isfinite(_torch(q, k, v, scale=scale)).all()
        )
