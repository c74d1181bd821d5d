"""Tests for attention/efficient/approximate.py: LSH (Reformer) and Linformer attention.

Each is checked against full attention in its limit, and LSH against a naive loop that
follows the documented recipe step by step.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import linformer_attention, lsh_attention, scaled_dot_product_attention
from attention.efficient.approximate import linformer_projection, lsh_buckets

normalize = torch.nn.functional.normalize


def shared_qk_reference(x, v, *, is_causal=False, normalize_keys=False):
    """Full shared-QK attention, self position masked unless it is the only key left."""
    n = x.shape[-2]
    eye = torch.eye(n, dtype=torch.bool)
    mask = ~eye
    if is_causal:
        mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
    mask = mask | (eye & ~mask.any(dim=-1, keepdim=True))
    keys = normalize(x, dim=-1) if normalize_keys else x
    return scaled_dot_product_attention(x, keys, v, attn_mask=mask)


@pytest.mark.parametrize("n", [1, 2, 37, 64])
@pytest.mark.parametrize("num_hashes", [1, 3])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("normalize_keys", [False, True])
def test_lsh_with_one_bucket_and_one_chunk_is_full_attention(
    n, num_hashes, is_causal, normalize_keys
):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    out = lsh_attention(
        x,
        x,
        v,
        num_buckets=1,
        num_hashes=num_hashes,
        chunk_size=n,
        is_causal=is_causal,
        normalize_keys=normalize_keys,
    )
    ref = shared_qk_reference(x, v, is_causal=is_causal, normalize_keys=normalize_keys)
    torch.testing.assert_close(out, ref)
    go = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad(out, (x, v), go),
        torch.autograd.grad(ref, (x, v), go),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


def naive_lsh(x, v, num_buckets, chunk_size, seed, is_causal, normalize_keys=True):
    """The docstring's recipe, one query at a time (one hash round)."""
    n, d = x.shape
    b = lsh_buckets(x, num_buckets, generator=torch.Generator().manual_seed(seed))[0]
    order = sorted(range(n), key=lambda p: (int(b[p]), p))
    slot = {p: s for s, p in enumerate(order)}
    keys = normalize(x, dim=-1) if normalize_keys else x
    out = torch.zeros(n, v.shape[1], dtype=x.dtype)
    for i in range(n):
        chunk = slot[i] // chunk_size
        seen = [
            j
            for j in range(n)
            if slot[j] // chunk_size in (chunk - 1, chunk)
            and b[j] == b[i]
            and (not is_causal or j <= i)
        ]
        seen = [j for j in seen if j != i] or [i]
        scores = torch.stack([x[i] @ keys[j] for j in seen]) / d**0.5
        out[i] = torch.softmax(scores, 0) @ v[seen]
    return out


@pytest.mark.parametrize(
    "n, num_buckets, chunk_size", [(37, 4, 5), (50, 8, 7), (16, 2, 16), (9, 2, 1)]
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_lsh_matches_naive_recipe(n, num_buckets, chunk_size, is_causal):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    out = lsh_attention(
        x,
        x,
        v,
        num_buckets=num_buckets,
        chunk_size=chunk_size,
        is_causal=is_causal,
        generator=torch.Generator().manual_seed(3),
        normalize_keys=True,
    )
    torch.testing.assert_close(
        out, naive_lsh(x, v, num_buckets, chunk_size, 3, is_causal)
    )
    plain = lsh_attention(
        x,
        x,
        v,
        num_buckets=num_buckets,
        chunk_size=chunk_size,
        is_causal=is_causal,
        generator=torch.Generator().manual_seed(3),
    )
    torch.testing.assert_close(
        plain, naive_lsh(x, v, num_buckets, chunk_size, 3, is_causal, False)
    )


def test_lsh_rounds_combine_by_softmax_mass():
    g = torch.Generator().manual_seed(0)
    x, v = (
        torch.randn(30, 4, generator=g, dtype=torch.float64),
        torch.randn(30, 2, generator=g, dtype=torch.float64),
    )
    # two rounds with the same rotations as two single rounds drawn in sequence
    both = lsh_attention(
        x,
        x,
        v,
        num_buckets=4,
        num_hashes=2,
        chunk_size=6,
        generator=torch.Generator().manual_seed(5),
    )
    assert both.shape == (30, 2) and torch.isfinite(both).all()
    # each output is a convex combination of values: it lies inside their bounding box
    assert (both <= v.max(0).values + 1e-12).all() and (
        both >= v.min(0).values - 1e-12
    ).all()


def test_lsh_buckets_similar_vectors_share_buckets():
    g = torch.Generator().manual_seed(0)
    base = normalize(torch.randn(20, 16, generator=g, dtype=torch.float64), dim=-1)
    near = base + 0.01 * torch.randn(20, 16, generator=g, dtype=torch.float64)
    b = lsh_buckets(
        torch.cat([base, 3 * near]),
        8,
        num_hashes=4,
        generator=torch.Generator().manual_seed(1),
    )
    assert b.shape == (4, 40) and b.min() >= 0 and b.max() < 8
    agree = (b[:, :20] == b[:, 20:]).double().mean()
    assert agree > 0.9
    # opposite vectors never share a bucket: argmax over [xR, -xR] flips half-way round
    opp = lsh_buckets(
        torch.cat([base, -base]), 8, generator=torch.Generator().manual_seed(1)
    )
    assert (opp[:, :20] != opp[:, 20:]).all()


def test_lsh_poisoned_other_bucket_is_ignored():
    # values of keys outside a query's bucket (and chunk neighbourhood) never reach it
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    v = torch.randn(40, 3, generator=g, dtype=torch.float64)
    gen = lambda: torch.Generator().manual_seed(4)
    b = lsh_buckets(x, 4, generator=gen())[0]
    v2 = v.clone()
    v2[b != b[0]] = 1e9
    a = lsh_attention(x, x, v, num_buckets=4, chunk_size=40, generator=gen())
    c = lsh_attention(x, x, v2, num_buckets=4, chunk_size=40, generator=gen())
    torch.testing.assert_close(a[b == b[0]], c[b == b[0]], rtol=0, atol=0)


@given(
    n=st.integers(1, 30),
    c=st.integers(1, 12),
    nb=st.sampled_from([1, 2, 4, 6]),
    causal=st.booleans(),
)
def test_lsh_property_matches_naive(n, c, nb, causal):
    g = torch.Generator().manual_seed(n)
    x, v = (
        torch.randn(n, 4, generator=g, dtype=torch.float64),
        torch.randn(n, 2, generator=g, dtype=torch.float64),
    )
    out = lsh_attention(
        x,
        x,
        v,
        num_buckets=nb,
        chunk_size=c,
        is_causal=causal,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(
        out, naive_lsh(x, v, nb, c, 0, causal, normalize_keys=False)
    )


def test_lsh_bad_input():
    x, v = torch.randn(5, 4), torch.randn(5, 2)
    with pytest.raises(ValueError, match="num_buckets must be 1 or even"):
        lsh_attention(x, x, v, num_buckets=3, chunk_size=2)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=0)
    with pytest.raises(ValueError, match="num_hashes must be >= 1, got 0"):
        lsh_attention(x, x, v, num_buckets=2, num_hashes=0, chunk_size=2)
    with pytest.raises(
        ValueError,
        match="key and value must have the same number of positions j, got 5 and 4",
    ):
        lsh_attention(x, x, v[:4], num_buckets=2, chunk_size=2)
    with pytest.raises(TypeError, match="normalize_keys must be a bool"):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=2, normalize_keys=1)
    with pytest.raises(TypeError, match="chunk_size must be an int, got float"):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=2.0)


def test_lsh_shares_queries_and_keys():
    x, v = torch.randn(5, 4), torch.randn(5, 2)
    with pytest.raises(
        ValueError,
        match=r"pass the same tensor as query and key, e.g. lsh_attention\(x, x, value",
    ):
        lsh_attention(x, x.clone(), v, num_buckets=2, chunk_size=2)


def test_lsh_refuses_attn_mask_and_checks_the_contract():
    x, v = torch.randn(5, 4), torch.randn(5, 2)
    with pytest.raises(ValueError, match="lsh_attention cannot apply an attn_mask"):
        lsh_attention(
            x,
            x,
            v,
            num_buckets=2,
            chunk_size=2,
            attn_mask=torch.ones(5, 5, dtype=torch.bool),
        )
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=2, is_causal="no")
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=2, scale=True)
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        lsh_attention(x, x, v.to("meta"), num_buckets=2, chunk_size=2)
    with pytest.raises(
        TypeError, match="generator must be a torch.Generator or None, got int"
    ):
        lsh_attention(x, x, v, num_buckets=2, chunk_size=2, generator=0)


def test_lsh_huge_chunk_is_one_chunk_and_empty_input():
    g = torch.Generator().manual_seed(0)
    x, v = (
        torch.randn(2, 9, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 9, 3, generator=g, dtype=torch.float64),
    )
    torch.testing.assert_close(
        lsh_attention(x, x, v, num_buckets=1, chunk_size=10**12),
        shared_qk_reference(x, v),
    )
    e = torch.zeros(2, 0, 4)
    assert lsh_attention(
        e, e, torch.zeros(2, 0, 3), num_buckets=2, chunk_size=4
    ).shape == (2, 0, 3)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_lsh_keys_it_does_not_see_never_reach_a_query(poison):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    v = torch.randn(40, 3, generator=g, dtype=torch.float64)
    gen = lambda: torch.Generator().manual_seed(4)
    b = lsh_buckets(x, 4, generator=gen())[0]
    v2 = v.clone()
    v2[b != b[0]] = poison
    a = lsh_attention(x, x, v, num_buckets=4, chunk_size=40, generator=gen())
    c = lsh_attention(x, x, v2, num_buckets=4, chunk_size=40, generator=gen())
    torch.testing.assert_close(a[b == b[0]], c[b == b[0]])


def test_lsh_grouped_query_flag_is_accepted():
    x, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 3)
    a = lsh_attention(
        x,
        x,
        v,
        num_buckets=2,
        chunk_size=3,
        enable_gqa=True,
        generator=torch.Generator().manual_seed(0),
    )
    b = lsh_attention(
        x, x, v, num_buckets=2, chunk_size=3, generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(a, b)


# --- Linformer ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 37, 64])
def test_linformer_with_identity_projections_is_full_attention(n):
    g = torch.Generator().manual_seed(n)
    q, k = (
        torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    v = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    eye = torch.eye(n, dtype=torch.float64)
    out = linformer_attention(q, k, v, key_projection=eye, value_projection=eye)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, ref)
    go = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), go),
        torch.autograd.grad(ref, (q, k, v), go),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


def test_linformer_is_attention_over_projected_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 20, 4, generator=g, dtype=torch.float64) for _ in range(3)
    )
    E = linformer_projection(20, 6, generator=g, dtype=torch.float64)
    F = linformer_projection(20, 6, generator=g, dtype=torch.float64)
    assert E.shape == (6, 20)
    out = linformer_attention(q, k, v, key_projection=E, value_projection=F, scale=0.3)
    ref = torch.softmax(q @ (E @ k).transpose(-1, -2) * 0.3, dim=-1) @ (F @ v)
    torch.testing.assert_close(out, ref)


def segment_mean(n, k):
    """(k, n) projection averaging k contiguous segments of the sequence (k = n:
    identity)."""
    E = torch.zeros(k, n, dtype=torch.float64)
    E[torch.arange(n) * k // n, torch.arange(n)] = 1.0
    return E / E.sum(dim=-1, keepdim=True)


def test_linformer_error_shrinks_as_k_grows_on_a_smooth_sequence():
    g = torch.Generator().manual_seed(0)
    n = 256
    t = torch.linspace(0, 1, n, dtype=torch.float64)[:, None]
    f = torch.arange(1, 5, dtype=torch.float64)
    smooth = torch.cat(
        [torch.sin(2 * torch.pi * f * t), torch.cos(2 * torch.pi * f * t)], dim=-1
    )  # (n, 8)
    k = smooth @ torch.randn(8, 16, generator=g, dtype=torch.float64)
    v = smooth @ torch.randn(8, 8, generator=g, dtype=torch.float64)
    q = torch.randn(n, 16, generator=g, dtype=torch.float64)
    full = scaled_dot_product_attention(q, k, v)
    errs = [
        (
            (
                linformer_attention(
                    q,
                    k,
                    v,
                    key_projection=segment_mean(n, m),
                    value_projection=segment_mean(n, m),
                )
                - full
            ).norm()
            / full.norm()
        ).item()
        for m in (4, 16, 64, 256)
    ]
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False))
    assert errs[-1] < 1e-12  # k = n: identity projections, exact


def lin(q, k, v, E, F, **kw):
    return linformer_attention(q, k, v, key_projection=E, value_projection=F, **kw)


def test_linformer_bad_input():
    q, k, v = torch.randn(5, 4), torch.randn(6, 4), torch.randn(6, 3)
    with pytest.raises(
        ValueError, match=r"key_projection must have shape \(..., k, n\) with n = 6"
    ):
        lin(q, k, v, torch.randn(3, 5), torch.randn(3, 6))
    with pytest.raises(ValueError, match="must project to the same k, got 3 and 2"):
        lin(q, k, v, torch.randn(3, 6), torch.randn(2, 6))
    E = torch.eye(6)
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 4 and 3"
    ):
        lin(q, k[..., :3], v, E, E)
    with pytest.raises(
        ValueError,
        match="key and value must have the same number of positions j, got 6 and 5",
    ):
        lin(q, k, v[:5], E, E)
    with pytest.raises(
        TypeError,
        match="value_projection must have dtype torch.float32, got torch.float64",
    ):
        lin(q, k, v, E, E.double())
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        linformer_projection(6, 0)
    with pytest.raises(ValueError, match="cannot apply attn_mask or is_causal"):
        lin(q, k, v, E, E, is_causal=True)
    with pytest.raises(ValueError, match="cannot apply attn_mask or is_causal"):
        lin(q, k, v, E, E, attn_mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        lin(q, k, v, E, E.to("meta"))
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        lin(q, k, v, E, E, enable_gqa="no")


def test_linformer_grouped_query_attention_and_empty_keys():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 8, 3, generator=g, dtype=torch.float64) for _ in range(2))
    E = linformer_projection(8, 4, generator=g, dtype=torch.float64)
    out = lin(q, k, v, E, E, enable_gqa=True)
    torch.testing.assert_close(
        out, lin(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), E, E)
    )
    z = torch.zeros(1, 2, 0, 3, dtype=torch.float64)
    out = lin(
        q,
        z,
        z,
        torch.zeros(4, 0, dtype=torch.float64),
        torch.zeros(4, 0, dtype=torch.float64),
        enable_gqa=True,
    )
    assert out.shape == (1, 4, 5, 3) and (out == 0).all()


def naive_lsh_sets(x, num_buckets, num_hashes, chunk_size, seed, is_causal):
    """Each round's key set P_i^(r) by the docstring's steps 4-5, one query at a
    time."""
    n = x.shape[0]
    rounds = lsh_buckets(
        x, num_buckets, num_hashes, generator=torch.Generator().manual_seed(seed)
    )
    sets = []
    for b in rounds:
        order = sorted(range(n), key=lambda p: (int(b[p]), p))
        slot = {p: s for s, p in enumerate(order)}
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            seen = [
                j
                for j in range(n)
                if slot[j] // chunk_size
                in (slot[i] // chunk_size - 1, slot[i] // chunk_size)
                and b[j] == b[i]
                and (not is_causal or j <= i)
            ]
            for j in [j for j in seen if j != i] or [i]:
                m[i, j] = True
        sets.append(m)
    return torch.stack(sets)  # (r, n, n)


@pytest.mark.parametrize(
    "n, num_buckets, num_hashes, chunk_size",
    [(37, 4, 3, 5), (50, 8, 2, 7), (24, 2, 4, 4)],
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_lsh_rounds_deduplicated_equal_attention_over_the_union(
    n, num_buckets, num_hashes, chunk_size, is_causal
):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    sets = naive_lsh_sets(x, num_buckets, num_hashes, chunk_size, 4, is_causal)
    assert (
        sets.sum(0) > 1
    ).any()  # some key is found in two rounds: the case that matters
    out = lsh_attention(
        x,
        x,
        v,
        num_buckets=num_buckets,
        num_hashes=num_hashes,
        chunk_size=chunk_size,
        is_causal=is_causal,
        generator=torch.Generator().manual_seed(4),
    )
    union = scaled_dot_product_attention(x, x, v, attn_mask=sets.any(0))
    torch.testing.assert_close(out, union)
    # without the correction, a key found in N rounds weighs N times: sum over rounds of
    # the masked exponentials, one query at a time
    doubled = lsh_attention(
        x,
        x,
        v,
        num_buckets=num_buckets,
        num_hashes=num_hashes,
        chunk_size=chunk_size,
        is_causal=is_causal,
        generator=torch.Generator().manual_seed(4),
        deduplicate=False,
    )
    w = torch.exp(x @ x.T / 6**0.5) * sets.sum(
        0
    )  # (n, n): each key weighted by its count
    torch.testing.assert_close(doubled, (w / w.sum(-1, keepdim=True)) @ v)
    assert not torch.allclose(doubled, union)


def test_lsh_deduplicate_must_be_bool():
    x, v = torch.randn(5, 4), torch.randn(5, 2)
    with pytest.raises(TypeError, match="deduplicate must be a bool"):
        lsh_attention(x, x, v, num_buckets=2, num_hashes=2, chunk_size=2, deduplicate=1)


def test_linformer_cannot_be_causal():
    q = torch.randn(4, 2)
    eye = torch.eye(4)
    with pytest.raises(
        ValueError, match="linformer_attention cannot apply attn_mask or is_causal"
    ):
        linformer_attention(
            q, q, q, is_causal=True, key_projection=eye, value_projection=eye
        )


def test_linformer_is_exact_for_a_permutation():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    P = torch.eye(9, dtype=torch.float64)[torch.randperm(9, generator=g)]
    torch.testing.assert_close(
        linformer_attention(q, k, v, key_projection=P, value_projection=P),
        scaled_dot_product_attention(q, k, v),
    )
