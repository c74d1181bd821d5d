"""FlexAttention (eager, CPU) against the package's dense masks and score modifiers.

Each mask_mod / score_mod below is the FlexAttention spelling of something the package
computes densely; the two must agree in float64. FlexAttention is imported by the ``fa``
fixture, not at collection: its import (with torch._dynamo) costs about 2 s of CPU.
"""

import pytest
import torch
import torch.nn.functional as F

from attention import (
    alibi_bias,
    alibi_slopes,
    causal_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from attention.practice.logits import softcap_attention
from attention.practice.sinks import attention_with_sinks, streaming_mask
from conftest import qkv

pytestmark = [
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    # FlexAttention's eager path costs about a second of CPU a test: make test runs them
    pytest.mark.slow,
]

D64 = torch.float64
N, H, D = 24, 4, 8


@pytest.fixture(scope="module")
def fa():
    """torch.nn.attention.flex_attention, imported when a test needs it."""
    from torch.nn.attention import flex_attention

    return flex_attention


def _qkv(h_kv=H, seed=0):
    return qkv(N, d=D, e=D, batch=(2,), h=H, h_kv=h_kv, seed=seed)


DOC = torch.tensor([0] * 5 + [1] * 11 + [2] * 8)  # three packed documents
PREFIX = 6


def causal(b, h, q, kv):
    return q >= kv


def window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 3)


def documents(b, h, q, kv):
    return (DOC[q] == DOC[kv]) & (q >= kv)


def prefix_lm(b, h, q, kv):
    return (kv < PREFIX) | (q >= kv)


def sinks_and_window(b, h, q, kv):
    return (q >= kv) & ((kv < 2) | (q - kv < 5))


DENSE = {
    causal: causal_mask(N),
    window: sliding_window_mask(N, 3, is_causal=True),
    documents: (DOC[:, None] == DOC[None, :]) & causal_mask(N),
    prefix_lm: causal_mask(N) | (torch.arange(N) < PREFIX)[None, :],
    sinks_and_window: streaming_mask(N, 2, 5),
}


@pytest.mark.parametrize("mask_mod", list(DENSE), ids=lambda f: f.__name__)
@pytest.mark.parametrize("h_kv", [H, 2])
def test_mask_mods_equal_the_dense_masks(fa, mask_mod, h_kv):
    q, k, v = _qkv(h_kv)
    block_mask = fa.create_block_mask(
        mask_mod, None, None, N, N, device="cpu", BLOCK_SIZE=8
    )
    out = fa.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=h_kv != H)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=DENSE[mask_mod], enable_gqa=h_kv != H
    )
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_block_mask_skips_exactly_the_empty_tiles(fa):
    block_mask = fa.create_block_mask(
        documents, None, None, N, N, device="cpu", BLOCK_SIZE=8
    )
    tiles = (
        DENSE[documents].reshape(3, 8, 3, 8).any(dim=(1, 3))
    )  # (query tile, key tile)
    assert torch.equal(block_mask.to_dense()[0, 0].bool(), tiles)


def test_alibi_score_mod_equals_the_dense_bias(fa):
    q, k, v = _qkv()
    slopes = alibi_slopes(H)  # (h,) float64

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    out = fa.flex_attention(q, k, v, score_mod=alibi)
    ref = scaled_dot_product_attention(
        q, k, v, attn_mask=alibi_bias(H, N, N, dtype=D64)
    )
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_softcap_score_mod_equals_softcap_attention(fa):
    q, k, v = _qkv()
    q = 4 * q

    def softcap(score, b, h, q_idx, kv_idx):
        return 5.0 * torch.tanh(score / 5.0)

    block_mask = fa.create_block_mask(
        causal, None, None, N, N, device="cpu", BLOCK_SIZE=8
    )
    out = fa.flex_attention(q, k, v, score_mod=softcap, block_mask=block_mask)
    torch.testing.assert_close(
        out, softcap_attention(q, k, v, is_causal=True, cap=5.0), atol=1e-12, rtol=0
    )


def test_sinks_as_score_mod_and_as_lse_correction(fa):
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, -3.0], dtype=D64)
    ref = attention_with_sinks(q, k, v, sinks, is_causal=True)

    # 1) one extra key of zeros: its score becomes the sink logit, its value is 0
    pad = torch.zeros(2, H, 1, D, dtype=D64)
    kz, vz = torch.cat([k, pad], dim=2), torch.cat([v, pad], dim=2)

    def sink(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx == N, sinks[h], score)

    def causal_or_sink(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (kv_idx == N)

    block_mask = fa.create_block_mask(
        causal_or_sink, None, None, N, N + 1, device="cpu", BLOCK_SIZE=8
    )
    out = fa.flex_attention(q, kz, vz, score_mod=sink, block_mask=block_mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)

    # 2) plain attention, rescaled by sigmoid(lse - sink), the share the keys keep
    block_mask = fa.create_block_mask(
        causal, None, None, N, N, device="cpu", BLOCK_SIZE=8
    )
    out, aux = fa.flex_attention(
        q, k, v, block_mask=block_mask, return_aux=fa.AuxRequest(lse=True)
    )
    out = out * torch.sigmoid(aux.lse - sinks[:, None])[..., None]
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_flex_lse_is_the_natural_log_sum_exp(fa):
    q, k, v = _qkv()
    _, aux = fa.flex_attention(q, k, v, return_aux=fa.AuxRequest(lse=True))
    scores = q @ k.transpose(-2, -1) / D**0.5
    torch.testing.assert_close(aux.lse, scores.logsumexp(-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        fa.flex_attention(q, k, v),
        F.scaled_dot_product_attention(q, k, v),
        atol=1e-12,
        rtol=0,
    )
