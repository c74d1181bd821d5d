"""Tests for attention.layers.dual_chunk: Dual Chunk Attention equals its dense masked
form (three full score matrices, one per query position set, picked by the chunk
relation), is plain causal RoPE attention up to s + w + 1 tokens, never uses a distance
above s + w, and refuses bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    RotaryConfig,
    apply_rope,
    dual_chunk_attention,
    dual_chunk_positions,
    scaled_dot_product_attention,
)
from conftest import qkv

DT = torch.float64


def _qkv(b, h, h_kv, i, j, d, e, seed=0):
    return qkv(i, j, d=d, e=e, batch=(b,), h=h, h_kv=h_kv, seed=seed)


def _dense_dca(q, k, v, s, w, attn_mask=None):
    """The whole (i, j) score matrix at once: intra, successive and inter scores, chosen
    per entry by the chunks of query and key, then the causal mask and a plain
    softmax."""
    i, j, d = q.shape[-2], k.shape[-2], q.shape[-1]
    q_pos, k_pos = torch.arange(j - i, j), torch.arange(j)
    if q.shape[-3] != k.shape[-3]:  # grouped-query: repeat each key/value head
        r = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    k_rot = apply_rope(k, k_pos % s)
    q_intra = apply_rope(q, q_pos % s)
    q_succ = apply_rope(q, torch.minimum(s + q_pos % s, torch.tensor(s + w)))
    q_inter = apply_rope(q, torch.full_like(q_pos, s + w))
    scores = [
        x @ k_rot.transpose(-2, -1) / math.sqrt(d) for x in (q_intra, q_succ, q_inter)
    ]
    c_q, c_k = (q_pos // s)[:, None], (k_pos // s)[None, :]
    combined = torch.where(
        c_q == c_k, scores[0], torch.where(c_q == c_k + 1, scores[1], scores[2])
    )
    combined = combined.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            combined = combined.masked_fill(~attn_mask, float("-inf"))
        else:
            combined = combined + attn_mask
    return torch.softmax(combined, dim=-1) @ v


def _plain_rope_attention(q, k, v):
    j, i = k.shape[-2], q.shape[-2]
    q_rot, k_rot = apply_rope(q, torch.arange(j - i, j)), apply_rope(k)
    r = q.shape[-3] // k.shape[-3]
    k_rot, v = k_rot.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    visible = torch.arange(j)[None, :] <= torch.arange(j - i, j)[:, None]
    scores = (q_rot @ k_rot.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~visible, -math.inf
    )
    return torch.softmax(scores, dim=-1) @ v


@given(
    j=st.integers(1, 30),
    decode=st.integers(0, 3),
    s=st.integers(1, 8),
    w_frac=st.floats(0, 0.99),
    gqa=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_dual_chunk_attention_equals_its_dense_masked_form(
    j, decode, s, w_frac, gqa, seed
):
    w = int(w_frac * s)
    i = (
        j if decode == 0 else min(decode, j)
    )  # a whole sequence, or the last few when decoding
    q, k, v = _qkv(2, 4, 2 if gqa else 4, i, j, 6, 3, seed=seed)
    got = dual_chunk_attention(q, k, v, chunk_size=s, local_window=w, enable_gqa=gqa)
    assert got.shape == (2, 4, i, 3)
    assert_close(got, _dense_dca(q, k, v, s, w), atol=1e-12, rtol=0)


@pytest.mark.parametrize(("s", "w"), [(4, 0), (4, 3), (8, 2), (5, 1)])
def test_up_to_s_plus_w_plus_one_tokens_it_is_plain_rope_attention(s, w):
    j = s + w + 1
    q, k, v = _qkv(1, 2, 2, j, j, 8, 4, seed=s + w)
    assert_close(
        dual_chunk_attention(q, k, v, chunk_size=s, local_window=w),
        _plain_rope_attention(q, k, v),
        atol=1e-12,
        rtol=0,
    )
    # one token more and the last query's distance to key 0 is capped: no longer equal
    q, k, v = _qkv(1, 2, 2, j + 1, j + 1, 8, 4, seed=s + w)
    assert not torch.allclose(
        dual_chunk_attention(q, k, v, chunk_size=s, local_window=w),
        _plain_rope_attention(q, k, v),
    )


def test_decoding_one_token_equals_the_last_row_of_the_full_sequence():
    q, k, v = _qkv(2, 2, 2, 23, 23, 8, 4, seed=3)
    full = dual_chunk_attention(q, k, v, chunk_size=6, local_window=2)
    step = dual_chunk_attention(q[..., -1:, :], k, v, chunk_size=6, local_window=2)
    assert_close(step, full[..., -1:, :], atol=1e-12, rtol=0)


def test_masks_apply_on_top_of_the_causal_pattern():
    q, k, v = _qkv(2, 2, 2, 12, 12, 4, 3, seed=4)
    keep = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    keep[0, ..., 2:5] = False  # hide three keys of the first sequence
    assert_close(
        dual_chunk_attention(q, k, v, chunk_size=4, local_window=1, attn_mask=keep),
        _dense_dca(q, k, v, 4, 1, attn_mask=keep),
        atol=1e-12,
        rtol=0,
    )
    bias = torch.randn(2, 2, 12, 12, dtype=DT)
    assert_close(
        dual_chunk_attention(q, k, v, chunk_size=4, local_window=1, attn_mask=bias),
        _dense_dca(q, k, v, 4, 1, attn_mask=bias),
        atol=1e-12,
        rtol=0,
    )


def test_a_query_with_no_visible_key_gets_zeros_and_gradients_flow():
    q, k, v = _qkv(1, 1, 1, 6, 6, 4, 2, seed=5)
    keep = torch.ones(6, 6, dtype=torch.bool)
    keep[3] = False
    out = dual_chunk_attention(q, k, v, chunk_size=2, local_window=1, attn_mask=keep)
    assert torch.equal(out[0, 0, 3], torch.zeros(2, dtype=DT))
    q.requires_grad_(True)
    v.requires_grad_(True)
    dual_chunk_attention(q, k, v, chunk_size=2, local_window=1).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()


def test_positions_never_exceed_s_plus_w():
    pos = dual_chunk_positions(1000, chunk_size=24, local_window=7)
    assert int(pos.key.max()) == 23 and int(pos.intra.max()) == 23
    assert int(pos.successive.min()) == 24 and int(pos.successive.max()) == 31
    assert bool((pos.inter == 31).all())
    q, k = torch.arange(1000)[:, None], torch.arange(1000)[None, :]
    c_q, c_k = q // 24, k // 24
    used = (
        torch.where(
            c_q == c_k,
            pos.intra[:, None],
            torch.where(c_q == c_k + 1, pos.successive[:, None], pos.inter[:, None]),
        )
        - pos.key[None, :]
    )
    visible = k <= q
    assert int(used[visible].min()) == 0 and int(used[visible].max()) == 31  # s + w
    # intra-chunk and the first w + 1 queries of the successive chunk keep the true
    # distance
    exact = (c_q == c_k) | ((c_q == c_k + 1) & (q % 24 <= 7))
    assert torch.equal(
        used[visible & exact], (q - k).expand(1000, 1000)[visible & exact]
    )


def test_bad_input_is_refused():
    q, k, v = _qkv(1, 2, 2, 5, 5, 4, 3)
    with pytest.raises(ValueError, match="causal by construction"):
        dual_chunk_attention(q, k, v, chunk_size=2, is_causal=False)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        dual_chunk_attention(q, k, v, chunk_size=2, is_causal=1)
    with pytest.raises(
        ValueError,
        match="local_window must be smaller than chunk_size, got local_window=4",
    ):
        dual_chunk_attention(q, k, v, chunk_size=4, local_window=4)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        dual_chunk_positions(5, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an int, got bool"):
        dual_chunk_attention(q, k, v, chunk_size=True)
    with pytest.raises(ValueError, match="must be even for RoPE, got 3"):
        dual_chunk_attention(q[..., :3], k[..., :3], v, chunk_size=2)
    with pytest.raises(ValueError, match="i <= j is needed, got i=5 and j=3"):
        dual_chunk_attention(q, k[..., :3, :], v[..., :3, :], chunk_size=2)
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d"
    ):
        dual_chunk_attention(q, k[..., :2], v, chunk_size=2)
    with pytest.raises(ValueError, match="scaling type must be one of"):
        dual_chunk_attention(
            q,
            k,
            v,
            chunk_size=2,
            rope=RotaryConfig(scaling={"type": "longrope", "factor": 2.0}),
        )
    with pytest.raises(
        TypeError, match="rope must be a RotaryConfig or None, got dict"
    ):
        dual_chunk_attention(q, k, v, chunk_size=2, rope={"base": 10.0})
    with pytest.raises(TypeError, match="base"):  # RotaryConfig is the one way
        dual_chunk_attention(q, k, v, chunk_size=2, base=10.0)


def test_rope_config_options_are_applied():
    g = torch.Generator().manual_seed(5)
    q, k, v = (
        torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3)
    )
    rope = RotaryConfig(
        base=50.0, interleaved=True, scaling={"type": "linear", "factor": 2.0}
    )
    out = dual_chunk_attention(q, k, v, chunk_size=8, local_window=1, rope=rope)
    plain = scaled_dot_product_attention(
        rope.rotate(q), rope.rotate(k), v, is_causal=True
    )
    torch.testing.assert_close(out, plain)  # 9 <= s + w + 1: plain RoPE attention
