"""Tests for learned attention sinks (gpt-oss) and the StreamingLLM cache.

transformers is imported by the tests that compare with it, not at collection (about
5 s of CPU); those tests are slow (``make test``, not ``make check``).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention.practice.sinks import (
    StreamingKVCache,
    attention_with_sinks,
    sink_attention_weights,
    streaming_mask,
)
from conftest import qkv

D64 = torch.float64


class _GptOssStub(nn.Module):
    """The attributes gpt-oss's eager attention reads from its module."""

    def __init__(self, sinks, groups):
        super().__init__()
        self.sinks = nn.Parameter(sinks)
        self.num_key_value_groups = groups
        self.eval()


def _qkv(b=2, h=4, h_kv=2, i=5, j=7, d=6, e=3, seed=0):
    return qkv(i, j, d=d, e=e, batch=(b,), h=h, h_kv=h_kv, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("h_kv", [4, 2, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_gpt_oss_eager_attention(h_kv, masked):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v = _qkv(h_kv=h_kv, i=6, j=6)
    sinks = torch.randn(4, dtype=D64)
    additive = None
    if masked:  # gpt-oss passes an additive causal mask of shape (b, 1, i, j)
        additive = torch.zeros(6, 6, dtype=D64).masked_fill(
            ~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf")
        )[None, None]
    ref, ref_w = eager_attention_forward(
        _GptOssStub(sinks, 4 // h_kv), q, k, v, additive, scaling=0.3
    )
    kwargs = dict(is_causal=masked, scale=0.3, enable_gqa=h_kv != 4)
    out = attention_with_sinks(q, k, v, sinks, **kwargs)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        sink_attention_weights(q, k, sinks, **kwargs), ref_w, atol=1e-12, rtol=0
    )
    if masked:  # the same mask given as a float mask or a boolean one
        torch.testing.assert_close(
            attention_with_sinks(
                q, k, v, sinks, attn_mask=additive, scale=0.3, enable_gqa=h_kv != 4
            ),
            out,
            atol=1e-12,
            rtol=0,
        )


@pytest.mark.slow
def test_gradients_equal_gpt_oss():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v = (t.requires_grad_() for t in _qkv(h_kv=2))
    sinks = torch.randn(4, dtype=D64, requires_grad=True)
    stub = _GptOssStub(sinks.detach().clone(), 2)
    ref = eager_attention_forward(stub, q, k, v, None, scaling=0.5)[0].transpose(1, 2)
    out = attention_with_sinks(q, k, v, sinks, scale=0.5, enable_gqa=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v, stub.sinks), g)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r, atol=1e-12, rtol=0)
    assert grads[3].abs().min() > 0  # every sink logit learns


def test_minus_infinity_sinks_give_plain_attention():
    q, k, v = _qkv(h_kv=2)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    none = torch.full((4,), float("-inf"), dtype=D64)
    out = attention_with_sinks(q, k, v, none, attn_mask=mask, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    # sinks given in float32 are cast to the query's dtype
    out32 = attention_with_sinks(q, k, v, none.float(), attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out32, ref, atol=1e-12, rtol=0)


def test_sink_is_a_sigmoid_gate_on_the_plain_weights():
    q, k, _ = _qkv(h=3, h_kv=3)
    sinks = torch.tensor([-1.0, 0.0, 2.0], dtype=D64)
    scores = q @ k.transpose(-2, -1) / 6**0.5
    gate = torch.sigmoid(scores.logsumexp(-1, keepdim=True) - sinks[:, None, None])
    torch.testing.assert_close(
        sink_attention_weights(q, k, sinks),
        scores.softmax(-1) * gate,
        atol=1e-12,
        rtol=0,
    )


def test_row_without_visible_key_gives_zero_output():
    q, k, v = _qkv(h=2, h_kv=2)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    for sinks in (
        torch.zeros(2, dtype=D64),
        torch.full((2,), float("-inf"), dtype=D64),
    ):
        out = attention_with_sinks(q, k, v, sinks, attn_mask=mask)
        assert torch.equal(
            out[:, :, 2], torch.zeros_like(out[:, :, 2])
        )  # exact by construction
        assert out.isfinite().all()


def test_bad_sinks():
    q, k, v = _qkv()
    with pytest.raises(
        ValueError, match=r"sinks must have shape \(h,\) = \(4,\).*got \(2,\)"
    ):
        attention_with_sinks(q, k, v, torch.zeros(2, dtype=D64), enable_gqa=True)
    with pytest.raises(ValueError, match=r"sinks must have shape \(h,\).*got \(1, 4\)"):
        attention_with_sinks(q, k, v, torch.zeros(1, 4, dtype=D64), enable_gqa=True)
    with pytest.raises(TypeError, match="sinks must be a torch.Tensor"):
        attention_with_sinks(q, k, v, [0.0] * 4, enable_gqa=True)
    with pytest.raises(TypeError, match="sinks must have a floating-point dtype"):
        attention_with_sinks(q, k, v, torch.zeros(4, dtype=torch.long), enable_gqa=True)
    with pytest.raises(ValueError, match="needs a heads axis"):
        attention_with_sinks(q[0, 0], k[0, 0], v[0, 0], torch.zeros(4, dtype=D64))
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        attention_with_sinks(q, k, v, torch.zeros(4, dtype=D64), enable_gqa="yes")
    with pytest.raises(ValueError, match="must be on the same device"):
        attention_with_sinks(
            q, k, v, torch.zeros(4, dtype=D64, device="meta"), enable_gqa=True
        )


# ------------------------------------------------------------------ StreamingLLM


def test_streaming_mask_formula():
    for n, s, w in [(9, 2, 3), (6, 0, 2), (5, 7, 1), (4, 1, 10)]:
        ref = torch.tensor(
            [[k <= q and (k < s or q - k < w) for k in range(n)] for q in range(n)]
        )
        assert torch.equal(streaming_mask(n, s, w), ref)


@pytest.mark.parametrize(
    ("num_sink", "window", "chunks"),
    [
        (2, 3, [1] * 12),
        (1, 4, [5, 1, 1, 3, 2]),
        (0, 3, [4, 1, 1, 4]),
        (4, 2, [2, 3, 1, 6]),
    ],
)
def test_decoding_through_the_cache_equals_the_dense_mask(num_sink, window, chunks):
    n = sum(chunks)
    q, k, v = _qkv(b=2, h=4, h_kv=2, i=n, j=n, d=4, e=4, seed=3)
    cache = StreamingKVCache(2, num_sink, window, num_kv_heads=2, head_dim=4, dtype=D64)
    outs, start = [], 0
    for c in chunks:
        keys, values, mask = cache.update(
            k[:, :, start : start + c], v[:, :, start : start + c]
        )
        assert keys.shape[2] <= num_sink + window + c
        outs.append(
            F.scaled_dot_product_attention(
                q[:, :, start : start + c],
                keys,
                values,
                attn_mask=mask,
                enable_gqa=True,
            )
        )
        start += c
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=streaming_mask(n, num_sink, window), enable_gqa=True
    )
    torch.testing.assert_close(torch.cat(outs, dim=2), ref, atol=1e-12, rtol=0)
    kept = sorted(cache.positions.tolist())
    assert kept == sorted(
        set(range(min(num_sink, n))) | set(range(max(n - window, 0), n))
    )
    assert cache.nbytes == 2 * 2 * 2 * (num_sink + window) * 4 * 8  # constant


def test_streaming_with_learned_sinks_and_reset():
    q, k, v = _qkv(b=1, h=2, h_kv=2, i=8, j=8, d=3, e=3, seed=5)
    sinks = torch.randn(2, dtype=D64)
    cache = StreamingKVCache(1, 1, 3, num_kv_heads=2, head_dim=3, dtype=D64)
    for _ in range(2):  # the second pass after reset() repeats the first exactly
        cache.reset()
        outs = []
        for t in range(8):
            keys, values, mask = cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
            outs.append(
                attention_with_sinks(
                    q[:, :, t : t + 1], keys, values, sinks, attn_mask=mask
                )
            )
        ref = attention_with_sinks(q, k, v, sinks, attn_mask=streaming_mask(8, 1, 3))
        torch.testing.assert_close(torch.cat(outs, dim=2), ref, atol=1e-12, rtol=0)


def test_streaming_bad_arguments():
    with pytest.raises(ValueError, match="window must be >= 1"):
        StreamingKVCache(1, 1, 0, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="num_sink must be >= 0"):
        streaming_mask(4, -1, 2)
    cache = StreamingKVCache(1, 1, 2, num_kv_heads=2, head_dim=3)
    with pytest.raises(ValueError, match="batch of 1 with 2 key/value heads of size 3"):
        cache.update(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match=r"must have shape \(b, h_kv, n, d\)"):
        cache.update(torch.ones(2, 1, 3), torch.ones(2, 1, 3))
    with pytest.raises(TypeError, match="the cache stores torch.float32"):
        cache.update(
            torch.ones(1, 2, 1, 3, dtype=D64), torch.ones(1, 2, 1, 3, dtype=D64)
        )
    with pytest.raises(ValueError, match="key and value must have the same shape"):
        cache.update(torch.ones(1, 2, 1, 3), torch.ones(1, 2, 2, 3))
