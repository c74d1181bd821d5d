"""Tests for attention.layers.kv_cache and MultiHeadAttention's incremental decoding:
prefill plus one-token steps equal full causal recomputation; bytes per token; cache
misuse."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    KVCache,
    MultiHeadAttention,
    RotaryConfig,
    causal_mask,
    padding_mask,
)
from attention.layers.kv_cache import kv_cache_bytes_per_token

DT = torch.float64


def _module(num_kv_heads, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(24, 6, num_kv_heads=num_kv_heads, dtype=DT).eval()


@pytest.mark.parametrize("num_kv_heads", [6, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("prefill", [0, 1, 4])
def test_prefill_plus_steps_equals_full_causal_recomputation(
    num_kv_heads, need_weights, prefill
):
    m = _module(num_kv_heads)
    b, total = 2, 9
    x = torch.randn(b, total, 24, dtype=DT)
    full, _ = m(x, x, x, is_causal=True)
    cache = m.new_cache(b, max_len=total)
    outs = []
    with torch.inference_mode():
        if prefill:
            p = x[:, :prefill]
            outs.append(
                m(p, p, p, is_causal=True, cache=cache, need_weights=need_weights)[0]
            )
        for t in range(prefill, total):
            step = x[:, t : t + 1]
            out, w = m(
                step, step, step, is_causal=True, cache=cache, need_weights=need_weights
            )
            outs.append(out)
            if need_weights:
                assert w.shape == (b, 6, 1, t + 1)
    assert cache.length == total
    assert_close(torch.cat(outs, dim=1), full)


@pytest.mark.parametrize("need_weights", [False, True])
def test_chunked_prefill_uses_bottom_right_alignment(need_weights):
    """Chunks of several new queries must see the whole cache plus a causal triangle."""
    m = _module(3)
    x = torch.randn(1, 10, 24, dtype=DT)
    full, _ = m(x, x, x, is_causal=True)
    cache = m.new_cache(1, 10)
    outs = []
    with torch.no_grad():
        for start, stop in ((0, 3), (3, 7), (7, 10)):
            c = x[:, start:stop]
            outs.append(
                m(c, c, c, is_causal=True, cache=cache, need_weights=need_weights)[0]
            )
    assert_close(torch.cat(outs, dim=1), full)


def test_top_left_mask_on_a_chunk_would_be_wrong():
    """The reason for bottom-right: a top-left mask hides cached keys from new
    queries."""
    m = _module(6)
    x = torch.randn(1, 6, 24, dtype=DT)
    full, _ = m(x, x, x, is_causal=True)
    cache = m.new_cache(1, 6)
    with torch.no_grad():
        m(x[:, :3], x[:, :3], x[:, :3], is_causal=True, cache=cache)
        wrong, _ = m(
            x[:, 3:], x[:, 3:], x[:, 3:], attn_mask=causal_mask(3, 6), cache=cache
        )
    assert not torch.allclose(wrong, full[:, 3:])


def test_cache_with_padding_mask():
    """A key-padding mask over all cached positions works alongside the cache."""
    m = _module(2)
    x = torch.randn(2, 5, 24, dtype=DT)
    pad = padding_mask([5, 3], 5)  # (b, 1, 1, j)
    full, _ = m(x, x, x, attn_mask=pad & causal_mask(5))
    cache = m.new_cache(2, 5)
    outs = []
    with torch.no_grad():
        for t in range(5):
            s = x[:, t : t + 1]
            outs.append(m(s, s, s, attn_mask=pad[..., : t + 1], cache=cache)[0])
    got = torch.cat(outs, dim=1)
    assert_close(got[0], full[0])
    assert_close(got[1, :3], full[1, :3])  # padded queries' outputs are irrelevant


def test_cache_stores_keys_and_values_in_place():
    cache = KVCache(2, 5, num_kv_heads=3, head_dim=4, dtype=DT)
    k1, v1 = torch.randn(2, 3, 2, 4, dtype=DT), torch.randn(2, 3, 2, 4, dtype=DT)
    k2, v2 = torch.randn(2, 3, 1, 4, dtype=DT), torch.randn(2, 3, 1, 4, dtype=DT)
    cache.update(k1, v1)
    keys, values = cache.update(k2, v2)
    assert cache.length == 3 and cache.remaining == 2
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert keys.data_ptr() == cache.keys.data_ptr()  # a view, no copy
    cache.reset()
    assert cache.length == 0
    assert cache.nbytes == 2 * 2 * 3 * 5 * 4 * 8


def test_new_cache_takes_the_module_shape_and_dtype():
    m = _module(2)
    cache = m.new_cache(3, 7)
    assert (cache.batch_size, cache.max_len, cache.num_kv_heads, cache.head_dim) == (
        3,
        7,
        2,
        4,
    )
    assert cache.dtype == DT


# ---------------------------------------------------------------- bytes per token


def test_bytes_per_token_formula():
    # 32 heads of 128 in fp16: 2 * 32 * 128 * 2 = 16 KiB per token per layer.
    assert kv_cache_bytes_per_token(32, 128) == 16384
    assert kv_cache_bytes_per_token(8, 128) == 4096
    assert kv_cache_bytes_per_token(1, 128) == 512
    assert (
        kv_cache_bytes_per_token(32, 128, dtype=torch.float32, num_layers=32)
        == 2 * 32 * 128 * 4 * 32
    )


def test_bytes_per_token_matches_a_filled_cache():
    cache = KVCache(1, 10, num_kv_heads=4, head_dim=16, dtype=torch.float16)
    assert cache.nbytes == 10 * kv_cache_bytes_per_token(4, 16, dtype=torch.float16)


def test_bytes_per_token_rejects_bad_dtype():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got str"):
        kv_cache_bytes_per_token(8, 128, dtype="fp16")


# ---------------------------------------------------------------- misuse


def test_rejects_batch_size_change_in_module():
    m = _module(2)
    cache = m.new_cache(2, 8)
    x = torch.randn(2, 3, 24, dtype=DT)
    with torch.no_grad():
        m(x, x, x, is_causal=True, cache=cache)
        y = torch.randn(3, 1, 24, dtype=DT)
        with pytest.raises(
            ValueError, match="built for batch size 2, got a batch of 3"
        ):
            m(y, y, y, is_causal=True, cache=cache)
    assert cache.length == 3  # nothing was written


def test_rejects_batch_size_change_in_update():
    cache = KVCache(2, 4, num_kv_heads=1, head_dim=2)
    with pytest.raises(ValueError, match="built for batch size 2, got a batch of 1"):
        cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_rejects_overflow_in_module():
    m = _module(1)
    cache = m.new_cache(1, 4)
    x = torch.randn(1, 3, 24, dtype=DT)
    with torch.no_grad():
        m(x, x, x, is_causal=True, cache=cache)
        with pytest.raises(
            ValueError, match="max_len=4 positions: 3 are stored and 2 more do not fit"
        ):
            m(x[:, :2], x[:, :2], x[:, :2], is_causal=True, cache=cache)
    assert cache.length == 3


def test_rejects_overflow_in_update():
    cache = KVCache(1, 2, num_kv_heads=1, head_dim=2)
    with pytest.raises(
        ValueError, match="max_len=2 positions: 0 are stored and 3 more do not fit"
    ):
        cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))


def test_rejects_cache_of_the_wrong_shape():
    m = _module(2)
    cache = KVCache(1, 4, num_kv_heads=6, head_dim=4, dtype=DT)
    x = torch.randn(1, 1, 24, dtype=DT)
    with pytest.raises(
        ValueError, match="holds 6 key/value heads of size 4, got 2 heads of size 4"
    ):
        m(x, x, x, cache=cache)


def test_rejects_wrong_heads_in_update():
    cache = KVCache(1, 4, num_kv_heads=2, head_dim=3)
    with pytest.raises(
        ValueError, match="holds 2 key/value heads of size 3, got 1 heads of size 3"
    ):
        cache.update(torch.zeros(1, 1, 1, 3), torch.zeros(1, 1, 1, 3))


def test_rejects_wrong_dtype_in_update():
    cache = KVCache(1, 4, num_kv_heads=1, head_dim=3, dtype=torch.float32)
    with pytest.raises(
        TypeError, match="stores torch.float32, got keys and values of torch.float64"
    ):
        cache.update(
            torch.zeros(1, 1, 1, 3, dtype=DT), torch.zeros(1, 1, 1, 3, dtype=DT)
        )


def test_rejects_key_value_shape_mismatch_in_update():
    cache = KVCache(1, 4, num_kv_heads=1, head_dim=3)
    with pytest.raises(ValueError, match="key and value must have the same shape"):
        cache.update(torch.zeros(1, 1, 1, 3), torch.zeros(1, 1, 2, 3))


def test_rejects_wrong_rank_in_update():
    cache = KVCache(1, 4, num_kv_heads=1, head_dim=3)
    with pytest.raises(ValueError, match=r"key must have shape \(b, h_kv, n, d\)"):
        cache.update(torch.zeros(1, 1, 3), torch.zeros(1, 1, 3))


def test_rejects_non_cache_object():
    m = _module(2)
    x = torch.randn(1, 1, 24, dtype=DT)
    with pytest.raises(TypeError, match="cache must be a KVCache or None, got dict"):
        m(x, x, x, cache={})


def test_rejects_causal_cache_with_different_query_and_key_counts():
    m = _module(2)
    cache = m.new_cache(1, 8)
    q, kv = torch.randn(1, 1, 24, dtype=DT), torch.randn(1, 3, 24, dtype=DT)
    with pytest.raises(
        ValueError, match="new queries must be the new positions, got 1 queries and 3"
    ):
        m(q, kv, kv, is_causal=True, cache=cache)


def test_rejects_mask_sized_without_the_cached_positions():
    m = _module(2)
    cache = m.new_cache(1, 8)
    x = torch.randn(1, 3, 24, dtype=DT)
    with torch.no_grad():
        m(x, x, x, is_causal=True, cache=cache)
        s = x[:, :1]
        # after 3 cached positions one new query sees j = 4 keys, not 2
        with pytest.raises(
            ValueError,
            match=r"attn_mask of shape \(1, 2\) does not broadcast.*\(1, 6, 1, 4\)",
        ):
            m(s, s, s, attn_mask=torch.ones(1, 2, dtype=torch.bool), cache=cache)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
        ({"max_len": 2.5}, TypeError, "max_len must be an int, got float"),
        (
            {"dtype": torch.int64},
            TypeError,
            "dtype must be a floating-point dtype, got torch.int64",
        ),
    ],
)
def test_rejects_bad_constructor_arguments(kwargs, error, message):
    args = {"batch_size": 1, "max_len": 4, "num_kv_heads": 1, "head_dim": 2} | kwargs
    with pytest.raises(error, match=message):
        KVCache(**args)


# -------------------------------------------------------- autograd, batch size, devices


def test_a_cache_under_autograd_fails_at_update_not_at_backward():
    m = _module(2).train()
    cache = m.new_cache(1, 6)
    x = torch.randn(1, 3, 24, dtype=DT)
    with pytest.raises(
        ValueError, match="autograd cannot differentiate through.*inference_mode"
    ):
        m(x, x, x, is_causal=True, cache=cache)
    assert cache.length == 0  # nothing was written
    k = torch.randn(1, 2, 1, 4, dtype=DT, requires_grad=True)
    with pytest.raises(ValueError, match="require grad"):
        cache.update(k, k)
    with torch.no_grad():
        cache.update(k, k)  # the same keys without a graph are fine
    assert cache.length == 1


def test_batch_size_message_advises_a_new_cache_not_reset():
    cache = KVCache(2, 4, num_kv_heads=1, head_dim=2)
    with pytest.raises(ValueError, match="create a new one for this batch") as err:
        cache.update(torch.zeros(3, 1, 1, 2), torch.zeros(3, 1, 1, 2))
    assert "reset" not in str(err.value)


def test_rejects_keys_on_another_device():
    cache = KVCache(1, 4, num_kv_heads=1, head_dim=2)
    z = torch.zeros(1, 1, 1, 2, device="meta")
    with pytest.raises(
        ValueError,
        match="cache and the new keys must be on the same device, got cpu and meta",
    ):
        cache.update(z, z)
    with pytest.raises(TypeError, match="device must be a torch.device"):
        KVCache(1, 4, num_kv_heads=1, head_dim=2, device=1.5)


@pytest.mark.parametrize("cached, new", [(0, 3), (4, 1), (4, 3)])
def test_causal_pattern_is_the_bottom_right_causal_mask(cached, new):
    cache = KVCache(1, 8, num_kv_heads=1, head_dim=2)
    cache.update(torch.zeros(1, 1, cached + new, 2), torch.zeros(1, 1, cached + new, 2))
    mask, is_causal = cache.causal_pattern(new)
    expected = causal_mask(new, cached + new, align="bottom-right")
    if is_causal:
        assert mask is None and torch.equal(expected, causal_mask(new, cached + new))
    elif mask is None:
        assert expected.all()
    else:
        assert torch.equal(mask, expected)
    with pytest.raises(ValueError, match="num_new must be <= the stored length"):
        cache.causal_pattern(cached + new + 1)


# ---------------------------------------------------------------- any split, one answer


def _splits(n):
    """Strategy: a prefill length >= 1 and the chunk lengths of the rest, summing to
    ``n``."""

    def chunks(rest):
        if rest == 0:
            return st.just([])
        return st.integers(1, rest).flatmap(
            lambda c: chunks(rest - c).map(lambda tail: [c, *tail])
        )

    return st.integers(1, n).flatmap(
        lambda p: chunks(n - p).map(lambda tail: [p, *tail])
    )


@given(split=_splits(9), need_weights=st.booleans(), rope=st.booleans())
@settings(max_examples=25, deadline=None)
def test_any_split_into_prefill_and_chunks_equals_the_full_causal_call(
    split, need_weights, rope
):
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        16,
        4,
        num_kv_heads=2,
        rope=RotaryConfig() if rope else None,
        dtype=torch.float64,
    ).eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        full, _ = mha(x, x, x, is_causal=True)
        cache = mha.new_cache(batch_size=2, max_len=9)
        pieces, start = [], 0
        for length in split:
            part = x[:, start : start + length]
            pieces.append(
                mha(
                    part,
                    part,
                    part,
                    is_causal=True,
                    cache=cache,
                    need_weights=need_weights,
                )[0]
            )
            start += length
    assert cache.length == 9
    assert_close(torch.cat(pieces, dim=1), full)


@given(split=_splits(8), absorb=st.booleans())
@settings(max_examples=20, deadline=None)
def test_latent_cache_any_split_equals_the_full_causal_call(split, absorb):
    from attention import MultiHeadLatentAttention

    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(
        16,
        2,
        kv_lora_rank=6,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=3,
        dtype=torch.float64,
    ).eval()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    with torch.no_grad():
        full, _ = mla(x, is_causal=True)
        cache = mla.new_cache(batch_size=2, max_len=8)
        pieces, start = [], 0
        for length in split:
            pieces.append(
                mla(
                    x[:, start : start + length],
                    is_causal=True,
                    cache=cache,
                    absorb=absorb,
                )[0]
            )
            start += length
    assert_close(torch.cat(pieces, dim=1), full)


def test_a_cache_made_under_inference_mode_refuses_outside_it_with_a_clear_message():
    mha = MultiHeadAttention(8, 2)
    with torch.inference_mode():
        cache = mha.new_cache(batch_size=1, max_len=4)
    x = torch.randn(1, 2, 8)
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match=r"created under torch.inference_mode\(\)"),
    ):
        mha(x, x, x, is_causal=True, cache=cache)
    with torch.inference_mode():  # and works inside it
        out, _ = mha(x, x, x, is_causal=True, cache=cache)
    assert out.shape == (1, 2, 8) and cache.length == 2


def test_check_update_is_the_documented_interface():
    cache = KVCache(1, 4, num_kv_heads=2, head_dim=3, dtype=torch.float64)
    cache.check_update(1, 4, 2, 3, dtype=torch.float64, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="do not fit"):
        cache.check_update(1, 5, 2, 3, dtype=torch.float64, device=torch.device("cpu"))
    with pytest.raises(TypeError, match="the cache stores torch.float64"):
        cache.check_update(1, 1, 2, 3, dtype=torch.float32, device=torch.device("cpu"))
    assert cache.length == 0  # a check writes nothing
