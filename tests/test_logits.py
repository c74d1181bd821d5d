"""Tests for soft-capping and QK-norm against their formulas and transformers' Gemma 2 /
Qwen3.

transformers is imported by the tests that compare with it, not at collection (about
5 s of CPU); those tests are slow (``make test``, not ``make check``).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention.practice.logits import qk_norm, soft_cap, softcap_attention
from conftest import qkv

D64 = torch.float64


def _qkv(b=2, h=4, h_kv=2, i=5, j=6, d=8, e=3, seed=0, size=1.0):
    return qkv(i, j, d=d, e=e, batch=(b,), h=h, h_kv=h_kv, seed=seed, size=size)


def test_soft_cap_formula_range_and_slope():
    s = torch.linspace(-200, 200, 401, dtype=D64, requires_grad=True)
    capped = soft_cap(s, 20.0)
    torch.testing.assert_close(capped, 20.0 * torch.tanh(s / 20.0), atol=0, rtol=0)
    assert capped.abs().max() <= 20.0 and bool(
        (capped.diff() >= 0).all()
    )  # monotone clamp
    (slope,) = torch.autograd.grad(capped.sum(), s)
    torch.testing.assert_close(
        slope, 1 - torch.tanh(s.detach() / 20.0) ** 2, atol=1e-12, rtol=0
    )
    small = torch.tensor([1e-3, -2e-3], dtype=D64)
    torch.testing.assert_close(
        soft_cap(small, 50.0), small, atol=0, rtol=1e-9
    )  # s^2 / 3c^2


@pytest.mark.slow
@pytest.mark.parametrize("h_kv", [4, 1])
def test_softcap_attention_equals_formula_and_gemma2(h_kv):
    from transformers.models.gemma2.modeling_gemma2 import (
        eager_attention_forward as gemma2_eager,
    )

    q, k, v = _qkv(h_kv=h_kv, i=6, j=6, size=3.0)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    out = softcap_attention(
        q, k, v, is_causal=True, scale=0.25, enable_gqa=h_kv != 4, cap=2.0
    )
    kr, vr = (t.repeat_interleave(4 // h_kv, dim=1) for t in (k, v))
    scores = (2.0 * torch.tanh(q @ kr.transpose(-2, -1) * 0.25 / 2.0)).masked_fill(
        ~mask, -math.inf
    )
    torch.testing.assert_close(out, scores.softmax(-1) @ vr, atol=1e-12, rtol=0)
    stub = nn.Module().eval()
    stub.num_key_value_groups = 4 // h_kv
    additive = torch.zeros(6, 6, dtype=D64).masked_fill(~mask, -math.inf)[None, None]
    ref = gemma2_eager(stub, q, k, v, additive, scaling=0.25, softcap=2.0)[0].transpose(
        1, 2
    )
    torch.testing.assert_close(
        out, ref, atol=1e-6, rtol=0
    )  # Gemma 2's softmax runs in float32


def test_no_cap_is_plain_attention_and_capping_raises_the_entropy():
    q, k, v = _qkv(size=4.0)
    plain = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(
        softcap_attention(q, k, v, enable_gqa=True), plain, atol=1e-12, rtol=0
    )
    mask = torch.rand(5, 6) > 0.4
    mask[:, 0] = True
    torch.testing.assert_close(
        softcap_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        atol=1e-12,
        rtol=0,
    )
    scores = q @ k.repeat_interleave(2, 1).transpose(-2, -1) / math.sqrt(8)

    def entropy(w):
        return -(w * w.clamp_min(1e-300).log()).sum(-1)

    assert bool(
        (
            entropy(soft_cap(scores, 1.0).softmax(-1))
            >= entropy(scores.softmax(-1)) - 1e-12
        ).all()
    )
    # the capped weights can never be sharper than e^{2c} : 1 between two keys
    w = soft_cap(scores, 1.0).softmax(-1)
    assert float((w.amax(-1) / w.amin(-1)).max()) <= math.exp(2.0) + 1e-9


def test_fully_masked_row_gives_zeros():
    q, k, v = _qkv(h_kv=4)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[1] = False
    out = softcap_attention(q, k, v, attn_mask=mask, cap=5.0)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))


@pytest.mark.slow
def test_qk_norm_formula_bound_and_qwen3():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = 5 * torch.randn(3, 4, 7, 16, dtype=D64)
    w = torch.rand(16, dtype=D64) + 0.5
    torch.testing.assert_close(
        qk_norm(x, w, eps=1e-6), F.rms_norm(x, (16,), w, eps=1e-6), atol=1e-12, rtol=0
    )
    ref = Qwen3RMSNorm(16, eps=1e-6).to(D64)
    with torch.no_grad():
        ref.weight.copy_(w)
    torch.testing.assert_close(
        qk_norm(x, w), ref(x), atol=1e-6, rtol=0
    )  # Qwen3: float32 inside
    qn, kn = qk_norm(x, eps=0.0), qk_norm(x.flip(0), eps=0.0)
    torch.testing.assert_close(
        qn.norm(dim=-1), torch.full((3, 4, 7), 4.0, dtype=D64), atol=1e-12, rtol=0
    )
    scores = qn @ kn.transpose(-2, -1) / 4.0  # |score| <= sqrt(d) = 4, whatever |x|
    assert float(scores.abs().max()) <= 4.0 + 1e-12
    cos = F.normalize(x, dim=-1) @ F.normalize(x.flip(0), dim=-1).transpose(-2, -1)
    torch.testing.assert_close(scores, 4.0 * cos, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "value, dtype",
    [
        (1e30, torch.float32),
        (1e-30, torch.float32),
        (300.0, torch.float16),
        (1e30, torch.bfloat16),
        (1e300, D64),
    ],
)
def test_qk_norm_of_huge_or_tiny_rows_is_the_float64_answer(value, dtype):
    """x / sqrt(mean(x²) + eps) for rows whose square overflows or underflows the dtype:
    the answer computed in float64 (x.square() alone gave zeros for 1e30 in float32)."""
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=D64) * value
    for eps in (0.0, 1e-6):
        expected = x / (x.square().mean(-1, keepdim=True) + eps).sqrt()
        if value == 1e300:  # its square overflows float64 too: RMS by hand
            expected = x / (value * math.sqrt((1 + 4 + 0.25 + 9) / 4))
        got = qk_norm(x.to(dtype), eps=eps)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), expected, rtol=1e-2, atol=0)
    assert (qk_norm(torch.zeros(2, 4)) == 0).all()  # eps > 0 keeps a zero row at 0
    assert qk_norm(torch.empty(3, 0)).shape == (3, 0)


def test_bad_arguments():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="cap must be finite and > 0, got 0.0"):
        softcap_attention(q, k, v, enable_gqa=True, cap=0.0)
    with pytest.raises(TypeError, match="cap must be a float"):
        soft_cap(q, cap=True)
    with pytest.raises(TypeError, match="scores must have a floating-point dtype"):
        soft_cap(torch.ones(3, dtype=torch.long), 1.0)
    with pytest.raises(
        ValueError, match=r"weight must have shape \(d,\) = \(8,\), got \(4,\)"
    ):
        qk_norm(q, torch.ones(4, dtype=D64))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        qk_norm(q, eps=-1.0)
    with pytest.raises(ValueError, match="query heads must be a multiple"):
        softcap_attention(
            q,
            torch.cat([k, k[:, :1]], 1),
            torch.cat([v, v[:, :1]], 1),
            enable_gqa=True,
            cap=1.0,
        )
    with pytest.raises(ValueError, match="pass either attn_mask or is_causal=True"):
        softcap_attention(
            q,
            k,
            v,
            attn_mask=torch.ones(5, 6, dtype=torch.bool),
            is_causal=True,
            enable_gqa=True,
        )
