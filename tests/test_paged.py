"""Tests for the paged KV cache: block bookkeeping, equality with contiguous caches,
errors."""

import random

import pytest
import torch
import torch.nn.functional as F

from attention import KVCache
from attention.practice.paged import PagedKVCache

D64 = torch.float64


def _fill(cache, lengths, h_kv, d, *, chunks=3, seed=0):
    """Grow several sequences interleaved, in uneven chunks; return their contiguous
    copies."""
    g = torch.Generator().manual_seed(seed)
    ids = [cache.add_sequence() for _ in lengths]
    full = {
        s: (
            torch.randn(h_kv, n, d, generator=g, dtype=D64),
            torch.randn(h_kv, n, d, generator=g, dtype=D64),
        )
        for s, n in zip(ids, lengths)
    }
    done = dict.fromkeys(ids, 0)
    rng = random.Random(seed)
    while any(done[s] < n for s, n in zip(ids, lengths)):
        s = rng.choice([s for s, n in zip(ids, lengths) if done[s] < n])
        n = lengths[ids.index(s)]
        step = min(rng.randint(1, chunks), n - done[s])
        k, v = full[s]
        cache.append(s, k[:, done[s] : done[s] + step], v[:, done[s] : done[s] + step])
        done[s] += step
    return ids, full


@pytest.mark.parametrize("seed", range(4))
def test_gather_equals_contiguous_under_random_block_orders(seed):
    cache = PagedKVCache(16, 3, num_kv_heads=2, head_dim=4, dtype=D64)
    random.Random(seed).shuffle(cache.free_blocks)
    lengths = [7, 1, 11, 5]
    ids, full = _fill(cache, lengths, 2, 4, seed=seed)
    for s, n in zip(ids, lengths):
        k, v = cache.gather(s)
        assert torch.equal(k, full[s][0]) and torch.equal(
            v, full[s][1]
        )  # copies: exact
        assert len(cache.block_tables[s]) == -(-n // 3)
    # every block belongs to exactly one owner (a sequence or the free list)
    owners = (
        sorted(b for t in cache.block_tables.values() for b in t) + cache.free_blocks
    )
    assert sorted(owners) == list(range(16))
    assert cache.blocks_in_use == sum(-(-n // 3) for n in lengths)


@pytest.mark.parametrize("is_causal", [False, True])
def test_attend_equals_contiguous_kv_cache(is_causal):
    h, h_kv, d, i = 4, 2, 5, 2
    cache = PagedKVCache(20, 4, num_kv_heads=h_kv, head_dim=d, dtype=D64)
    random.Random(1).shuffle(cache.free_blocks)
    lengths = [9, 3, 14]
    ids, full = _fill(cache, lengths, h_kv, d, seed=1)
    q = torch.randn(len(ids), h, i, d, dtype=D64)
    out = cache.attend(q, ids, is_causal=is_causal)
    for row, (s, n) in enumerate(zip(ids, lengths)):
        contiguous = KVCache(1, 16, num_kv_heads=h_kv, head_dim=d, dtype=D64)
        k, v = contiguous.update(full[s][0][None], full[s][1][None])  # (1, h_kv, n, d)
        mask = None
        if is_causal:  # the queries are the newest i positions
            mask = torch.arange(n)[None, :] <= torch.arange(n - i, n)[:, None]
        ref = F.scaled_dot_product_attention(
            q[row : row + 1], k, v, attn_mask=mask, enable_gqa=True
        )
        torch.testing.assert_close(out[row : row + 1], ref, atol=1e-12, rtol=0)


def test_decoding_through_shuffled_blocks_equals_dense_causal_attention():
    h_kv, d, n = 1, 3, 10
    cache = PagedKVCache(12, 2, num_kv_heads=h_kv, head_dim=d, dtype=D64)
    random.Random(3).shuffle(cache.free_blocks)
    a, b = cache.add_sequence(), cache.add_sequence()
    q, k, v = (torch.randn(2, h_kv, n, d, dtype=D64) for _ in range(3))
    outs = []
    for t in range(
        n
    ):  # both sequences decode in lockstep, blocks interleave in the pool
        cache.append(a, k[0, :, t : t + 1], v[0, :, t : t + 1])
        cache.append(b, k[1, :, t : t + 1], v[1, :, t : t + 1])
        outs.append(cache.attend(q[:, :, t : t + 1], [a, b]))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(torch.cat(outs, dim=2), ref, atol=1e-12, rtol=0)


def test_free_returns_blocks_and_memory_accounting():
    cache = PagedKVCache(6, 4, num_kv_heads=2, head_dim=8, dtype=torch.float16)
    assert cache.nbytes == 2 * 6 * 4 * 2 * 8 * 2
    assert cache.bytes_per_block == 2 * 4 * 2 * 8 * 2
    a = cache.add_sequence()
    cache.append(
        a,
        torch.zeros(2, 9, 8, dtype=torch.float16),
        torch.zeros(2, 9, 8, dtype=torch.float16),
    )
    assert cache.blocks_in_use == 3 and cache.lengths[a] == 9
    cache.free(a)
    assert cache.blocks_in_use == 0 and sorted(cache.free_blocks) == list(range(6))


def test_pool_overflow_is_a_clear_error_and_writes_nothing():
    cache = PagedKVCache(2, 2, num_kv_heads=1, head_dim=1)
    a = cache.add_sequence()
    cache.append(a, torch.ones(1, 3, 1), torch.ones(1, 3, 1))
    with pytest.raises(
        ValueError, match=r"pool is full: sequence 0 needs 1 more block"
    ):
        cache.append(a, torch.ones(1, 2, 1), torch.ones(1, 2, 1))
    with pytest.raises(RuntimeError, match="pool is full"):
        cache.append(a, torch.ones(1, 2, 1), torch.ones(1, 2, 1))
    assert cache.lengths[a] == 3 and cache.free_blocks == []
    cache.append(
        a, torch.ones(1, 1, 1), torch.ones(1, 1, 1)
    )  # the partial block still fits


def test_unknown_sequence_id():
    cache = PagedKVCache(2, 2, num_kv_heads=1, head_dim=1)
    cache.add_sequence()
    for call in (
        lambda: cache.gather(5),
        lambda: cache.free(5),
        lambda: cache.append(5, torch.ones(1, 1, 1), torch.ones(1, 1, 1)),
        lambda: cache.attend(torch.ones(1, 1, 1, 1), [5]),
    ):
        with pytest.raises(
            ValueError, match=r"no sequence with id 5 .* known ids: \[0\]"
        ):
            call()
    with pytest.raises(KeyError):
        cache.gather(5)
    with pytest.raises(TypeError, match="sequence id must be an int"):
        cache.gather("0")


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        PagedKVCache(2, 0, num_kv_heads=1, head_dim=1)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        PagedKVCache(2, 2, num_kv_heads=1, head_dim=1, dtype=torch.int64)
    cache = PagedKVCache(4, 2, num_kv_heads=2, head_dim=3)
    s = cache.add_sequence()
    with pytest.raises(
        ValueError, match="holds 2 key/value heads of size 3, got 1 heads"
    ):
        cache.append(s, torch.ones(1, 1, 3), torch.ones(1, 1, 3))
    with pytest.raises(ValueError, match=r"must have shape \(h_kv, n, d\)"):
        cache.append(s, torch.ones(1, 2, 1, 3), torch.ones(1, 2, 1, 3))
    with pytest.raises(TypeError, match="the pool stores torch.float32"):
        cache.append(s, torch.ones(2, 1, 3, dtype=D64), torch.ones(2, 1, 3, dtype=D64))
    with pytest.raises(ValueError, match="key and value must have the same shape"):
        cache.append(s, torch.ones(2, 1, 3), torch.ones(2, 2, 3))
    cache.append(s, torch.ones(2, 1, 3), torch.ones(2, 1, 3))
    with pytest.raises(ValueError, match=r"b = len\(seq_ids\) = 1"):
        cache.attend(torch.ones(2, 2, 1, 3), [s])
    with pytest.raises(ValueError, match="must be the newest positions"):
        cache.attend(torch.ones(1, 2, 2, 3), [s])
    with pytest.raises(ValueError, match="multiple of 2 heads of size 3"):
        cache.attend(torch.ones(1, 3, 1, 3), [s])
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        cache.attend(torch.ones(1, 2, 1, 3), [s], is_causal="yes")


def test_attend_with_no_sequence_gives_an_empty_batch_like_torch():
    """seq_ids = [] is a step with no active sequence: the output is the empty
    (0, h, i, d) batch that torch's attention returns for a batch of zero; the other
    arguments are still checked."""
    cache = PagedKVCache(4, 2, num_kv_heads=2, head_dim=3)
    cache.add_sequence()
    query = torch.ones(0, 4, 1, 3)
    out = cache.attend(query, [], is_causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, torch.ones(0, 2, 5, 3), torch.ones(0, 2, 5, 3), enable_gqa=True
    )
    assert out.shape == expected.shape == (0, 4, 1, 3) and out.dtype == cache.dtype
    with pytest.raises(TypeError, match="scale must be a float or None, got str"):
        cache.attend(query, [], scale="big")
    with pytest.raises(ValueError, match=r"b = len\(seq_ids\) = 0"):
        cache.attend(torch.ones(1, 4, 1, 3), [])
