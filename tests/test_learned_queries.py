"""Tests of attention/layers/learned_queries.py: learned-query cross-attention against
a manual formula and torch's MultiheadAttention, padding against the unpadded input,
the toy tasks' invariants, and match_queries against brute force and scipy."""

import itertools
import math

import pytest
import torch
from torch import nn

from attention.layers.learned_queries import (
    LatentCrossAttention,
    match_queries,
    scene_batch,
    typed_set_batch,
)

DT = torch.float64


def make(m=3, d=8, h=2, d_in=5, *, seed=0, **kw):
    torch.manual_seed(seed)
    return LatentCrossAttention(m, d, h, input_dim=d_in, dtype=DT, **kw)


def manual(layer, x, keep=None):
    """Per-head softmax(L Wq (X Wk)^T / sqrt(d_h)) X Wv, then the output projection."""
    a = layer.attn
    q = layer.latents @ a.w_query.weight.T + a.w_query.bias  # (m, h*dh)
    k = x @ a.w_key.weight.T + a.w_key.bias  # (b, n, h*dh)
    v = x @ a.w_value.weight.T + a.w_value.bias
    h = layer.num_heads
    dh = q.shape[-1] // h
    outs, weights = [], []
    for i in range(h):
        sl = slice(i * dh, (i + 1) * dh)
        s = q[:, sl] @ k[..., sl].transpose(-2, -1) / math.sqrt(dh)  # (b, m, n)
        if keep is not None:
            s = s.masked_fill(~keep[:, None, :], float("-inf"))
        w = torch.softmax(s, -1)
        weights.append(w)
        outs.append(w @ v[..., sl])
    out = torch.cat(outs, -1) @ a.w_out.weight.T + a.w_out.bias
    return out, torch.stack(weights, 1)


# ----------------------------------------------------------------- the layer


@pytest.mark.parametrize("h", [1, 2])
def test_matches_the_manual_formula(h):
    layer = make(h=h)
    x = torch.randn(4, 7, 5, dtype=DT)
    out, w = layer(x, need_weights=True)
    ref_out, ref_w = manual(layer, x)
    assert out.shape == (4, 3, 8) and w is not None and w.shape == (4, h, 3, 7)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=0)


def test_matches_torch_multihead_attention_with_the_same_weights():
    layer = make(d_in=8, h=2)
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=DT)
    a = layer.attn
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([a.w_query.weight, a.w_key.weight, a.w_value.weight])
        )
        ref.in_proj_bias.copy_(
            torch.cat([a.w_query.bias, a.w_key.bias, a.w_value.bias])
        )
        ref.out_proj.weight.copy_(a.w_out.weight)
        ref.out_proj.bias.copy_(a.w_out.bias)
    x = torch.randn(2, 6, 8, dtype=DT)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out, _ = layer(x, input_mask=keep)
    q = layer.latents.expand(2, 3, 8)
    # torch's key_padding_mask says True = ignore: the opposite convention
    ref_out, _ = ref(q, x, x, key_padding_mask=~keep)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)


def test_output_has_m_rows_whatever_the_input_size():
    layer = make()
    for n in (1, 5, 40):
        out, _ = layer(torch.randn(2, n, 5, dtype=DT))
        assert out.shape == (2, 3, 8)


def test_padded_inputs_give_the_unpadded_answer():
    layer = make()
    sizes = [6, 3, 1]
    sets = [torch.randn(n, 5, dtype=DT) for n in sizes]
    x = torch.zeros(3, 6, 5, dtype=DT)
    for i, s in enumerate(sets):
        x[i, : len(s)] = s
        # garbage in the padding must not matter
        x[i, len(s) :] = 1e3 * torch.randn(6 - len(s), 5, dtype=DT)
    keep = torch.arange(6) < torch.tensor(sizes)[:, None]  # True = a real element
    out, w = layer(x, input_mask=keep, need_weights=True)
    assert w is not None
    for i, s in enumerate(sets):
        alone, w_alone = layer(s[None], need_weights=True)
        assert w_alone is not None
        torch.testing.assert_close(out[i], alone[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(w[i, ..., : len(s)], w_alone[0], atol=1e-12, rtol=0)
        assert bool((w[i, ..., len(s) :] == 0).all())


def test_input_mask_combines_with_a_boolean_or_float_attn_mask():
    layer = make(h=1)
    x = torch.randn(2, 5, 5, dtype=DT)
    keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
    extra = torch.rand(2, 1, 3, 5) < 0.7
    extra[..., 0] = True  # every row keeps something
    out_b, _ = layer(x, input_mask=keep, attn_mask=extra)
    both = (keep[:, None, None, :] & extra).squeeze(1)
    ref, _ = layer.attn(layer.latents.expand(2, 3, 8), x, x, attn_mask=both[:, None])
    torch.testing.assert_close(out_b, ref, atol=1e-12, rtol=0)
    bias = torch.randn(2, 1, 3, 5, dtype=DT)
    out_f, _ = layer(x, input_mask=keep, attn_mask=bias)
    ref_f, _ = layer.attn(
        layer.latents.expand(2, 3, 8),
        x,
        x,
        attn_mask=bias.masked_fill(~keep[:, None, None, :], float("-inf")),
    )
    torch.testing.assert_close(out_f, ref_f, atol=1e-12, rtol=0)


def test_gradients_reach_the_latents():
    layer = make()
    out, _ = layer(torch.randn(2, 4, 5, dtype=DT))
    out.sum().backward()
    assert layer.latents.grad is not None and bool(layer.latents.grad.abs().sum() > 0)


def test_init_std_scales_the_latents():
    torch.manual_seed(0)
    small = LatentCrossAttention(64, 32, init_std=0.02)
    assert 0.015 < float(small.latents.detach().std()) < 0.025


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: LatentCrossAttention(0, 8), ValueError, "num_latents"),
        (lambda: LatentCrossAttention(2, 8, init_std=-1.0), ValueError, "init_std"),
        (lambda: make()(torch.randn(2, 4, 6, dtype=DT)), ValueError, "input_dim=5"),
        (lambda: make()(torch.randn(4, 5, dtype=DT)), ValueError, "(b, n, input_dim"),
        (lambda: make()(torch.randn(2, 4, 5)), TypeError, "float32"),
        (
            lambda: make()(torch.randn(2, 4, 5, dtype=DT), input_mask=torch.ones(2, 4)),
            TypeError,
            "input_mask",
        ),
        (
            lambda: make()(
                torch.randn(2, 4, 5, dtype=DT),
                input_mask=torch.ones(2, 3, dtype=torch.bool),
            ),
            ValueError,
            "(b, n) = (2, 4)",
        ),
        (
            lambda: make()(
                torch.randn(2, 4, 5, dtype=DT),
                input_mask=torch.tensor([[True] * 4, [False] * 4]),
            ),
            ValueError,
            "row 1 has none",
        ),
    ],
)
def test_bad_inputs_name_the_rule(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)


# ----------------------------------------------------------------- the toy tasks


def test_typed_set_batch_target_is_the_mean_per_type():
    s = typed_set_batch(50, num_types=3, max_items=9, generator=gen(0), dtype=DT)
    assert s.items.shape == (50, 9, 4) and s.target.shape == (50, 3)
    for i in range(50):
        n = int(s.mask[i].sum())
        assert 3 <= n <= 9 and bool(s.mask[i, :n].all())
        assert bool((s.types[i, n:] == -1).all()) and bool((s.items[i, n:] == 0).all())
        for t in range(3):
            vals = [float(s.items[i, j, -1]) for j in range(n) if s.types[i, j] == t]
            assert vals, "every type occurs"
            assert abs(sum(vals) / len(vals) - float(s.target[i, t])) < 1e-12


def test_typed_set_batch_is_reproducible_and_validated():
    a, b = typed_set_batch(4, generator=gen(3)), typed_set_batch(4, generator=gen(3))
    assert torch.equal(a.items, b.items)
    with pytest.raises(ValueError, match="max_items must be >= num_types"):
        typed_set_batch(2, num_types=5, max_items=4)
    with pytest.raises(ValueError, match="batch_size"):
        typed_set_batch(0)


def test_scene_batch_one_object_per_region_listed_left_to_right():
    s = scene_batch(
        200, width=12, regions=4, num_classes=3, max_objects=3, generator=gen(1)
    )
    assert s.cells.shape == (200, 12, 4 + 12)
    content = s.cells[..., :4].argmax(-1)  # (b, W) class per cell, 0 = background
    for i in range(200):
        k = int(s.count[i])
        assert 1 <= k <= 3
        pos = s.positions[i, :k].tolist()
        assert pos == sorted(pos) and len({p // 3 for p in pos}) == k
        assert bool((s.classes[i, k:] == 0).all()) and bool(
            (s.positions[i, k:] == -1).all()
        )
        expect = torch.zeros(12, dtype=torch.long)
        expect[s.positions[i, :k]] = s.classes[i, :k]
        assert torch.equal(content[i], expect)
    assert torch.equal(s.cells[0, :, 4:], torch.eye(12))


def test_scene_batch_validates():
    with pytest.raises(ValueError, match="multiple of regions"):
        scene_batch(2, width=10, regions=4)
    with pytest.raises(ValueError, match="max_objects must be <= regions"):
        scene_batch(2, regions=2, max_objects=3)


# ----------------------------------------------------------------- matching


def brute_force(cost, k):
    """The least-cost injective map of the first k objects to queries, by loops."""
    m = cost.shape[0]
    best, arg = math.inf, None
    for perm in itertools.permutations(range(m), k):
        total = sum(float(cost[perm[o], o]) for o in range(k))
        if total < best:
            best, arg = total, perm
    return best, arg


def test_match_queries_finds_the_least_total_cost():
    torch.manual_seed(0)
    cost = torch.rand(30, 5, 3, dtype=DT)
    count = torch.randint(0, 4, (30,))
    match = match_queries(cost, count)
    assert match.shape == (30, 3)
    for i in range(30):
        k = int(count[i])
        best, _ = brute_force(cost[i], k)
        chosen = match[i, :k].tolist()
        assert len(set(chosen)) == k and bool((match[i, k:] == -1).all())
        total = sum(float(cost[i, q, o]) for o, q in enumerate(chosen))
        assert abs(total - best) < 1e-12


@pytest.mark.slow  # imports scipy: make test, not make check
def test_match_queries_agrees_with_scipy():
    optimize = pytest.importorskip("scipy.optimize")
    torch.manual_seed(1)
    cost = torch.randn(20, 6, 4, dtype=DT)
    match = match_queries(cost)
    for i in range(20):
        rows, cols = optimize.linear_sum_assignment(cost[i].numpy())
        ref = cost[i].numpy()[rows, cols].sum()
        ours = sum(float(cost[i, q, o]) for o, q in enumerate(match[i].tolist()))
        assert abs(ours - ref) < 1e-12


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((torch.rand(2, 3),), ValueError, "(b, m, g)"),
        ((torch.rand(1, 2, 3),), ValueError, "m=2 and g=3"),
        ((torch.rand(1, 9, 2),), ValueError, "at most 8"),
        ((torch.rand(2, 3, 2), torch.tensor([1.0, 2.0])), TypeError, "integers"),
        ((torch.rand(2, 3, 2), torch.tensor([1, 3])), ValueError, "[0, g=2]"),
        ((torch.rand(2, 3, 2), torch.tensor([1])), ValueError, "shape (b,)"),
    ],
)
def test_match_queries_bad_inputs(args, error, words):
    with pytest.raises(error) as info:
        match_queries(*args)
    assert words in str(info.value)


# ----------------------------------------------------------------- training


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_latents_learn_the_typed_set_task():
    """Four latents and a shared linear read-out learn the mean per type: the test
    error falls far below the error of always answering 0, and each latent puts most
    of its weight on the elements of one type."""
    torch.manual_seed(0)
    pool = LatentCrossAttention(4, 8, input_dim=5)
    head = nn.Linear(8, 1)
    opt = torch.optim.Adam([*pool.parameters(), *head.parameters()], lr=0.02)
    g = gen(1)
    for _ in range(80):
        b = typed_set_batch(64, generator=g)
        out, _ = pool(b.items, input_mask=b.mask)
        loss = ((head(out).squeeze(-1) - b.target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    test = typed_set_batch(500, generator=gen(99))
    with torch.no_grad():
        out, w = pool(test.items, input_mask=test.mask, need_weights=True)
        mse = float(((head(out).squeeze(-1) - test.target) ** 2).mean())
    baseline = float((test.target**2).mean())
    assert mse < 0.1 * baseline
    assert w is not None
    own = test.types[:, None, :] == torch.arange(4)[None, :, None]  # (b, T, n)
    share = (w[:, 0] * own).sum(-1).mean(0)  # (T,) latent t's weight on type t
    assert bool(share.min() > 0.7), share
