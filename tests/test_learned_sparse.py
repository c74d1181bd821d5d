"""Tests for attention/learned_sparse.py: NSA, MoBA, DSA and the selection measurements.

References, all in float64:
- flash-linear-attention's naive functions (fla-core, a test-only dependency):
  ``naive_nsa`` (whole, without the window branch, which calls flash-attn),
  ``naive_nsa_compression``, ``naive_nsa_topk``, ``naive_nsa_selection``,
  ``naive_dsa`` and ``naive_dsa_indexer``. They cast their inputs with ``.float()``;
  the tests make that a no-op on float64 tensors so they compute in float64, and replace
  ``mean_pooling`` (a Triton kernel) by a loop, so they run on a CPU. fla-core has no
  naive MoBA (``parallel_moba`` needs flash-attn on a GPU): MoBA is checked against a
  loop written from MoBA's own reference (``moba_attn_varlen_naive``) and the paper.
- plain per-query loops written from the papers' equations (below), everywhere;
- PyTorch's ``scaled_dot_product_attention`` (full causal attention when every block or
  key is kept, a band or a block-diagonal mask otherwise);
- each function's dense form (the package's ``scaled_dot_product_attention`` with the
  selection as a boolean mask, True = may attend);
- autograd (``gradcheck``).
"""

import math

import pytest
import torch
import torch.nn.functional as F

import attention.efficient.learned_sparse as ls
from attention import (
    deepseek_sparse_attention,
    lightning_index_scores,
    lightning_indexer,
    moba_attention,
    native_sparse_attention,
    selection_mask,
    selection_stats,
)

DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def qkv(b=2, h=4, h_kv=2, n=19, d=5, e=3, seed=0):
    return (
        randn(b, h, n, d, seed=seed),
        randn(b, h_kv, n, d, seed=seed + 1),
        randn(b, h_kv, n, e, seed=seed + 2),
    )


def full_causal(q, k, v, scale=None):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True, scale=scale
    )


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


# ------------------------------------------------------------------ loop references


def attend(query_row, keys, values, scale):
    """The softmax(scale q . k_j)-weighted sum of the v_j, a loop over the keys."""
    scores = [scale * float(query_row @ key) for key in keys]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    out = torch.zeros(values[0].shape, dtype=DT)
    for w, val in zip(weights, values, strict=True):
        out += (w / total) * val
    return out


def block_keys(blocks, bs, n, t):
    """Positions of the listed blocks that are at or before t."""
    return [
        j for c in sorted(blocks) for j in range(c * bs, min(n, (c + 1) * bs)) if j <= t
    ]


def loop_pool(x, bs):
    """(..., n, d) -> (..., nb, d): a mean per block (the last over what it has)."""
    n = x.shape[-2]
    return torch.stack(
        [
            x[..., c * bs : min(n, (c + 1) * bs), :].mean(-2)
            for c in range(math.ceil(n / bs))
        ],
        dim=-2,
    )


def loop_nsa(q, k, v, gates, bs, num, window, scale=None):
    """NSA from the paper (Yuan et al. 2025, eqs. 5-12) with fla-core's choices: mean
    pooling, one block size, forced first/own/previous blocks. Returns the output and,
    per (b, h_kv, t), the chosen blocks."""
    b, h, n, d = q.shape
    h_kv, e = k.shape[1], v.shape[-1]
    r = h // h_kv
    scale = d**-0.5 if scale is None else scale
    kc, vc = loop_pool(k, bs), loop_pool(v, bs)
    nb = kc.shape[-2]
    out = torch.zeros(b, h, n, e, dtype=DT)
    chosen_all = {}
    for bi in range(b):
        for g in range(h_kv):
            heads = range(g * r, (g + 1) * r)
            for t in range(n):
                visible = [c for c in range(nb) if (c + 1) * bs - 1 <= t]
                importance = dict.fromkeys(visible, 0.0)
                o_cmp = {}
                for hh in heads:
                    if not visible:
                        o_cmp[hh] = torch.zeros(e, dtype=DT)
                        continue
                    scores = [
                        scale * float(q[bi, hh, t] @ kc[bi, g, c]) for c in visible
                    ]
                    top = max(scores)
                    p = [math.exp(s - top) for s in scores]
                    p = [x / sum(p) for x in p]
                    for c, pc in zip(visible, p, strict=True):
                        importance[c] += pc / r
                    o_cmp[hh] = sum(
                        pc * vc[bi, g, c] for c, pc in zip(visible, p, strict=True)
                    )
                own = t // bs
                forced = [own] + [c for c in (own - 1, 0) if 0 <= c < own]
                forced = list(dict.fromkeys(forced))
                rest = sorted(
                    (c for c in visible if c not in forced),
                    key=lambda c: -importance[c],
                )
                chosen = (forced + rest)[:num]
                chosen_all[bi, g, t] = sorted(chosen)
                keys = block_keys(chosen, bs, n, t)
                near = list(range(max(0, t - window + 1), t + 1))
                for hh in heads:
                    gc, gs, gw = (
                        1.0 if gate is None else float(gate[bi, hh, t])
                        for gate in gates
                    )
                    o = gc * o_cmp[hh] + gs * attend(
                        q[bi, hh, t],
                        [k[bi, g, j] for j in keys],
                        [v[bi, g, j] for j in keys],
                        scale,
                    )
                    if window > 0:
                        o = o + gw * attend(
                            q[bi, hh, t],
                            [k[bi, g, j] for j in near],
                            [v[bi, g, j] for j in near],
                            scale,
                        )
                    out[bi, hh, t] = o
    return out, chosen_all


def loop_moba(q, k, v, bs, top_k, scale=None):
    """MoBA (Lu et al. 2025, eqs. 3-6): the own block, plus the top_k - 1 complete past
    blocks with the highest q . mean(k_block); causal inside the own block."""
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    r = h // h_kv
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(b, h, n, v.shape[-1], dtype=DT)
    chosen_all = {}
    for bi in range(b):
        for hh in range(h):
            g = hh // r
            for t in range(n):
                own = t // bs
                gate = {
                    c: float(q[bi, hh, t] @ k[bi, g, c * bs : (c + 1) * bs].mean(0))
                    for c in range(own)
                }
                past = sorted(gate, key=lambda c: -gate[c])[: top_k - 1]
                chosen_all[bi, hh, t] = sorted([*past, own])
                keys = block_keys([*past, own], bs, n, t)
                out[bi, hh, t] = attend(
                    q[bi, hh, t],
                    [k[bi, g, j] for j in keys],
                    [v[bi, g, j] for j in keys],
                    scale,
                )
    return out, chosen_all


def loop_index_scores(iq, ik, iw, scale=None, act=torch.relu):
    """DeepSeek-V3.2's index score I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s])."""
    b, h_i, n, d_i = iq.shape
    scale = d_i**-0.5 if scale is None else scale
    scores = torch.full((b, n, n), float("-inf"), dtype=DT)
    for bi in range(b):
        for t in range(n):
            for s in range(t + 1):
                scores[bi, t, s] = sum(
                    (1.0 if iw is None else float(iw[bi, j, t]))
                    * float(
                        act(
                            torch.tensor(
                                scale * float(iq[bi, j, t] @ ik[bi, s]), dtype=DT
                            )
                        )
                    )
                    for j in range(h_i)
                )
    return scores


def loop_dsa(q, k, v, iq, ik, iw, top_k, scale=None):
    b, h, n, d = q.shape
    r = h // k.shape[1]
    scale = d**-0.5 if scale is None else scale
    index = loop_index_scores(iq, ik, iw)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=DT)
    chosen_all = {}
    for bi in range(b):
        for t in range(n):
            keys = sorted(range(t + 1), key=lambda s: -float(index[bi, t, s]))[:top_k]
            chosen_all[bi, t] = sorted(keys)
            for hh in range(h):
                g = hh // r
                out[bi, hh, t] = attend(
                    q[bi, hh, t],
                    [k[bi, g, j] for j in keys],
                    [v[bi, g, j] for j in keys],
                    scale,
                )
    return out, chosen_all


def listed(row):
    return [int(x) for x in row if x >= 0]


# ------------------------------------------------------------------ NSA


NSA_CASES = [  # (h, h_kv, n, block, num_selected, window)
    (4, 2, 19, 4, 3, 0),
    (6, 2, 21, 5, 4, 6),
    (3, 3, 13, 3, 2, 2),  # num_selected < 3: the forced blocks compete
    (2, 1, 9, 4, 16, 3),  # more blocks asked for than exist
    (2, 1, 7, 10, 2, 0),  # a block longer than the sequence
    (4, 1, 11, 1, 5, 4),  # blocks of one key
]


@pytest.mark.parametrize("h, h_kv, n, bs, num, window", NSA_CASES)
def test_nsa_equals_the_loop_of_the_paper(h, h_kv, n, bs, num, window):
    q, k, v = qkv(2, h, h_kv, n, seed=n)
    gates = tuple(rand(2, h, n, seed=s) for s in range(3))
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=gates[0],
        gate_selected=gates[1],
        gate_window=gates[2],
        block_size=bs,
        num_selected_blocks=num,
        window_size=window,
        return_block_indices=True,
    )
    want, chosen = loop_nsa(q, k, v, gates, bs, num, window)
    close(out, want)
    nb = math.ceil(n / bs)
    assert blocks.shape == (2, h_kv, n, min(num, nb)) and blocks.dtype == torch.long
    for (bi, g, t), picked in chosen.items():
        assert listed(blocks[bi, g, t]) == picked


def test_nsa_gates_default_to_one():
    q, k, v = qkv(seed=3)
    ones = torch.ones(2, 4, 19, dtype=DT)
    kw = dict(block_size=4, num_selected_blocks=3, window_size=5)
    close(
        native_sparse_attention(q, k, v, **kw),
        native_sparse_attention(
            q, k, v, gate_compressed=ones, gate_selected=ones, gate_window=ones, **kw
        ),
    )
    close(
        native_sparse_attention(q, k, v, **kw),
        loop_nsa(q, k, v, (None,) * 3, 4, 3, 5)[0],
    )


@pytest.mark.parametrize("h, h_kv, n, bs, num, window", NSA_CASES)
def test_nsa_equals_its_dense_form_in_small_chunks(
    monkeypatch, h, h_kv, n, bs, num, window
):
    q, k, v = qkv(1, h, h_kv, n, seed=7)
    gates = tuple(rand(1, h, n, seed=s + 5) for s in range(3))
    want, want_blocks = ls._nsa_dense_reference(q, k, v, gates, bs, num, window)
    monkeypatch.setattr(ls, "_CHUNK_ELEMENTS", 1)  # one query per step
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=gates[0],
        gate_selected=gates[1],
        gate_window=gates[2],
        block_size=bs,
        num_selected_blocks=num,
        window_size=window,
        return_block_indices=True,
    )
    close(out, want)
    assert torch.equal(blocks, want_blocks)


def test_nsa_selected_blocks_are_causal_sorted_and_keep_the_forced_ones():
    q, k, v = qkv(2, 4, 2, 37, seed=11)
    bs, num = 4, 5
    _, blocks = native_sparse_attention(
        q, k, v, block_size=bs, num_selected_blocks=num, return_block_indices=True
    )
    for t in range(37):
        own = t // bs
        for row in blocks[:, :, t].reshape(-1, num):
            picked = listed(row)
            assert picked == sorted(set(picked))  # ascending, no repeat
            assert row[len(picked) :].eq(-1).all()  # the empty slots last
            assert len(picked) == min(num, own + 1)
            assert max(picked) == own  # never a future block
            assert {own, max(own - 1, 0), 0} <= set(picked)


def test_nsa_keeping_every_block_is_full_causal_attention_in_the_selected_branch():
    q, k, v = qkv(2, 6, 3, 23, seed=2)
    zero = torch.zeros(2, 6, 23, dtype=DT)
    out = native_sparse_attention(
        q, k, v, gate_compressed=zero, block_size=4, num_selected_blocks=6
    )
    close(out, full_causal(q, k, v))


def test_nsa_window_branch_is_banded_causal_attention():
    q, k, v = qkv(2, 4, 2, 17, seed=4)
    zero = torch.zeros(2, 4, 17, dtype=DT)
    out = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=zero,
        gate_selected=zero,
        block_size=4,
        num_selected_blocks=2,
        window_size=5,
    )
    pos = torch.arange(17)
    band = (pos[:, None] >= pos) & (pos[:, None] - pos < 5)
    close(out, F.scaled_dot_product_attention(q, k, v, band, enable_gqa=True))


def test_nsa_compressed_branch_sees_only_complete_blocks():
    q, k, v = qkv(1, 2, 1, 14, seed=5)
    zero = torch.zeros(1, 2, 14, dtype=DT)
    out = native_sparse_attention(
        q, k, v, gate_selected=zero, block_size=4, num_selected_blocks=2
    )
    kc, vc = loop_pool(k, 4), loop_pool(v, 4)
    complete = (torch.arange(4) + 1) * 4 - 1 <= torch.arange(14)[:, None]
    want = F.scaled_dot_product_attention(q, kc, vc, complete, enable_gqa=True)
    want[..., :3, :] = 0.0  # no complete block yet: torch gives NaN, the branch gives 0
    close(out, want)


# ---- against fla-core's naive functions


@pytest.fixture
def fla_nsa(monkeypatch):
    """fla-core's NSA reference, computing in float64 on a CPU."""
    naive = pytest.importorskip("fla.ops.nsa.naive", reason="fla-core is not installed")
    keep = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor,
        "float",
        lambda self, *a, **kw: self if self.dtype == DT else keep(self, *a, **kw),
    )
    # mean_pooling is a Triton kernel; the pooling it computes, over [b, t, h, d]
    monkeypatch.setattr(
        naive,
        "mean_pooling",
        lambda x, bs, cu_seqlens=None: loop_pool(x.transpose(1, 2), bs).transpose(1, 2),
    )
    return naive


def bthd(x):
    """(b, h, n, d) -> fla's (b, n, h, d)."""
    return x.transpose(1, 2)


@pytest.mark.slow  # imports fla: make test, not make check
@pytest.mark.parametrize("h, h_kv, n, bs, num", [(16, 1, 21, 4, 3), (32, 2, 18, 5, 4)])
def test_nsa_equals_fla_naive_nsa(fla_nsa, h, h_kv, n, bs, num):
    """The whole reference (it asks for groups of 16 query heads or more)."""
    q, k, v = qkv(2, h, h_kv, n, d=4, seed=n)
    g_cmp, g_slc = rand(2, h, n, seed=1), rand(2, h, n, seed=2)
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=g_cmp,
        gate_selected=g_slc,
        block_size=bs,
        num_selected_blocks=num,
        return_block_indices=True,
    )
    want, want_blocks = fla_nsa.naive_nsa(
        bthd(q),
        bthd(k),
        bthd(v),
        g_cmp=g_cmp.transpose(1, 2),
        g_slc=g_slc.transpose(1, 2),
        block_counts=num,
        block_size=bs,
        return_block_indices=True,
    )
    close(out, bthd(want))
    close(out, ls._nsa_dense_reference(q, k, v, (g_cmp, g_slc, None), bs, num, 0)[0])
    assert torch.equal(
        blocks, ls._ascending(want_blocks.transpose(1, 2))[..., : blocks.shape[-1]]
    )


@pytest.mark.slow  # imports fla: make test, not make check
@pytest.mark.parametrize(
    "h, h_kv, n, bs, num",
    [(4, 2, 19, 4, 3), (6, 2, 23, 5, 5), (3, 1, 17, 3, 8), (2, 2, 10, 4, 16)],
)
def test_nsa_branches_and_selection_equal_fla_naive_pieces(
    fla_nsa, h, h_kv, n, bs, num
):
    q, k, v = qkv(2, h, h_kv, n, seed=h + n)
    scale = q.shape[-1] ** -0.5
    zero, one = torch.zeros(2, h, n, dtype=DT), torch.ones(2, h, n, dtype=DT)
    k_cmp, v_cmp = bthd(loop_pool(k, bs)), bthd(loop_pool(v, bs))
    # the compressed branch alone
    out = native_sparse_attention(
        q, k, v, gate_selected=zero, block_size=bs, num_selected_blocks=num
    )
    want, _ = fla_nsa.naive_nsa_compression(bthd(q), k_cmp, v_cmp, bs, scale)
    close(out, bthd(want))
    # the selection
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=zero,
        block_size=bs,
        num_selected_blocks=num,
        return_block_indices=True,
    )
    picked = fla_nsa.naive_nsa_topk(bthd(q), k_cmp, num, bs, scale)  # (b, n, h_kv, num)
    assert torch.equal(
        blocks, ls._ascending(picked.transpose(1, 2))[..., : blocks.shape[-1]]
    )
    # the selected branch, given fla's own selection
    want = fla_nsa.naive_nsa_selection(bthd(q), bthd(k), bthd(v), picked, bs, scale)
    close(out, bthd(want))
    close(
        native_sparse_attention(
            q,
            k,
            v,
            gate_compressed=one,
            gate_selected=zero,
            block_size=bs,
            num_selected_blocks=num,
        ),
        bthd(fla_nsa.naive_nsa_compression(bthd(q), k_cmp, v_cmp, bs, scale)[0]),
    )


# ------------------------------------------------------------------ MoBA


MOBA_CASES = [  # (h, h_kv, n, block, top_k)
    (4, 2, 19, 4, 2),
    (3, 1, 22, 5, 3),
    (2, 2, 13, 3, 1),
    (2, 1, 9, 4, 7),
    (2, 1, 6, 10, 2),
]


@pytest.mark.parametrize("h, h_kv, n, bs, top_k", MOBA_CASES)
def test_moba_equals_the_loop_of_the_paper(h, h_kv, n, bs, top_k):
    q, k, v = qkv(2, h, h_kv, n, seed=n + top_k)
    out, blocks = moba_attention(
        q, k, v, block_size=bs, top_k=top_k, return_block_indices=True
    )
    want, chosen = loop_moba(q, k, v, bs, top_k)
    close(out, want)
    assert blocks.shape == (2, h, n, min(top_k, math.ceil(n / bs)))
    for (bi, hh, t), picked in chosen.items():
        assert listed(blocks[bi, hh, t]) == picked


@pytest.mark.parametrize("h, h_kv, n, bs, top_k", MOBA_CASES)
def test_moba_equals_its_dense_form_in_small_chunks(monkeypatch, h, h_kv, n, bs, top_k):
    q, k, v = qkv(1, h, h_kv, n, seed=3)
    want = ls._moba_dense_reference(q, k, v, bs, top_k, scale=0.7)
    monkeypatch.setattr(ls, "_CHUNK_ELEMENTS", 1)
    close(moba_attention(q, k, v, block_size=bs, top_k=top_k, scale=0.7), want)


@pytest.mark.parametrize("n, bs", [(17, 4), (20, 5), (3, 8)])
def test_moba_with_every_block_is_full_causal_attention(n, bs):
    q, k, v = qkv(2, 4, 2, n, seed=n)
    close(
        moba_attention(q, k, v, block_size=bs, top_k=math.ceil(n / bs)),
        full_causal(q, k, v),
    )
    close(moba_attention(q, k, v, block_size=bs, top_k=10**9), full_causal(q, k, v))


def test_moba_top_1_is_the_own_block_alone():
    q, k, v = qkv(2, 2, 1, 14, seed=8)
    pos = torch.arange(14)
    same_block = (pos[:, None] // 4 == pos // 4) & (pos[:, None] >= pos)
    close(
        moba_attention(q, k, v, block_size=4, top_k=1),
        F.scaled_dot_product_attention(q, k, v, same_block, enable_gqa=True),
    )


def test_moba_blocks_are_the_own_block_and_past_blocks():
    q, k, v = qkv(1, 4, 2, 30, seed=9)
    _, blocks = moba_attention(
        q, k, v, block_size=4, top_k=3, return_block_indices=True
    )
    for t in range(30):
        for row in blocks[0, :, t]:
            picked = listed(row)
            assert picked[-1] == t // 4 and len(picked) == min(3, t // 4 + 1)
            assert picked == sorted(set(picked))


# ------------------------------------------------------------------ DSA


def index_inputs(b=2, h_i=3, n=19, d_i=4, seed=0):
    """Index tensors whose scores never tie: every key and head 0 of every query are
    positive, so each score has a positive term that moves with the key."""
    iq = randn(b, h_i, n, d_i, seed=seed)
    iq[:, 0] = iq[:, 0].abs() + 0.1
    ik = rand(b, n, d_i, seed=seed + 1) + 0.1
    iw = randn(b, h_i, n, seed=seed + 2)
    iw[:, 0] = iw[:, 0].abs() + 0.5
    return iq, ik, iw


@pytest.fixture
def fla_dsa(monkeypatch):
    naive = pytest.importorskip("fla.ops.dsa.naive", reason="fla-core is not installed")
    keep = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor,
        "float",
        lambda self, *a, **kw: self if self.dtype == DT else keep(self, *a, **kw),
    )
    return naive


@pytest.mark.slow  # imports fla: make test, not make check
@pytest.mark.parametrize(
    "h, h_kv, n, top_k", [(4, 2, 19, 5), (3, 1, 23, 1), (2, 2, 9, 30)]
)
@pytest.mark.parametrize("weighted", [True, False])
def test_dsa_equals_fla_naive_dsa(fla_dsa, h, h_kv, n, top_k, weighted):
    q, k, v = qkv(2, h, h_kv, n, seed=n)
    iq, ik, iw = index_inputs(n=n, seed=n)
    iw = iw if weighted else None
    out, picked = deepseek_sparse_attention(
        q, k, v, iq, ik, iw, top_k=top_k, scale=0.6, return_indices=True
    )
    want, want_picked = fla_dsa.naive_dsa(
        bthd(q),
        bthd(k),
        bthd(v),
        bthd(iq),
        ik,
        None if iw is None else iw.transpose(1, 2),
        topk=top_k,
        scale=0.6,
        return_indices=True,
    )
    close(out, bthd(want))
    assert torch.equal(picked, ls._ascending(want_picked)[..., : picked.shape[-1]])


@pytest.mark.slow  # imports fla: make test, not make check
@pytest.mark.parametrize(
    "activation, name", [(None, "relu"), (torch.nn.Identity(), None), (F.gelu, "gelu")]
)
def test_lightning_indexer_equals_fla_naive_dsa_indexer(fla_dsa, activation, name):
    iq, ik, iw = index_inputs(n=21, seed=4)
    picked = lightning_indexer(iq, ik, iw, top_k=6, scale=0.3, activation=activation)
    want = fla_dsa.naive_dsa_indexer(
        bthd(iq), ik, iw.transpose(1, 2), topk=6, scale=0.3, activation=name
    )
    assert torch.equal(picked, ls._ascending(want))


@pytest.mark.parametrize(
    "h, h_kv, n, top_k", [(4, 2, 17, 4), (6, 3, 12, 1), (2, 1, 8, 8)]
)
def test_dsa_equals_the_loop_of_the_paper(h, h_kv, n, top_k):
    q, k, v = qkv(2, h, h_kv, n, seed=n)
    iq, ik, iw = index_inputs(n=n, seed=1)
    out, picked = deepseek_sparse_attention(
        q, k, v, iq, ik, iw, top_k=top_k, return_indices=True
    )
    want, chosen = loop_dsa(q, k, v, iq, ik, iw, top_k)
    close(out, want)
    for (bi, t), keys in chosen.items():
        assert listed(picked[bi, t]) == keys
    close(lightning_index_scores(iq, ik, iw), loop_index_scores(iq, ik, iw))


def test_dsa_equals_its_dense_form_in_small_chunks(monkeypatch):
    q, k, v = qkv(2, 4, 2, 15, seed=6)
    iq, ik, iw = (
        randn(2, 2, 15, 3, seed=1),
        randn(2, 15, 3, seed=2),
        randn(2, 2, 15, seed=3),
    )
    want = ls._dsa_dense_reference(q, k, v, iq, ik, iw, 4)
    monkeypatch.setattr(ls, "_CHUNK_ELEMENTS", 1)
    close(deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=4), want)


def test_dsa_with_every_key_is_full_causal_attention():
    q, k, v = qkv(2, 4, 2, 16, seed=5)
    iq, ik, iw = (
        randn(2, 2, 16, 3, seed=1),
        randn(2, 16, 3, seed=2),
        randn(2, 2, 16, seed=3),
    )
    close(
        deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=16), full_causal(q, k, v)
    )
    close(
        deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=10**9),
        full_causal(q, k, v),
    )


def test_indexer_selection_is_causal_and_sorted():
    iq, ik, iw = (
        randn(2, 3, 25, 4, seed=1),
        randn(2, 25, 4, seed=2),
        randn(2, 3, 25, seed=3),
    )
    picked = lightning_indexer(iq, ik, iw, top_k=5)
    assert picked.shape == (2, 25, 5)
    for t in range(25):
        for row in picked[:, t]:
            keys = listed(row)
            assert len(keys) == min(5, t + 1) and keys == sorted(set(keys))
            assert max(keys) <= t and row[len(keys) :].eq(-1).all()


def test_index_key_with_a_heads_axis_of_one_is_the_same():
    iq, ik, iw = index_inputs(n=11)
    close(
        lightning_index_scores(iq, ik, iw), lightning_index_scores(iq, ik[:, None], iw)
    )


# ------------------------------------------------------------------ measuring


def test_selection_mask_is_the_listed_blocks_up_to_the_query():
    picks = torch.tensor([[[0, -1], [0, 2], [1, -1], [2, 0], [2, 1]]])  # (1, n=5, 2)
    mask = selection_mask(picks, block_size=2)
    for t in range(5):
        for j in range(5):
            assert bool(mask[0, t, j]) == ((j // 2) in listed(picks[0, t]) and j <= t)


def test_selection_stats_equal_a_loop():
    q, k, v = qkv(2, 4, 2, 14, seed=3)
    _, blocks = native_sparse_attention(
        q, k, v, block_size=3, num_selected_blocks=2, return_block_indices=True
    )
    stats = selection_stats(q, k, blocks, block_size=3, scale=0.5)
    for bi in range(2):
        for hh in range(4):
            for t in range(14):
                weights = torch.softmax(
                    0.5 * (k[bi, hh // 2, : t + 1] @ q[bi, hh, t]), 0
                )
                keys = block_keys(listed(blocks[bi, hh // 2, t]), 3, 14, t)
                close(stats.mass[bi, hh, t], weights[keys].sum())
                assert stats.keys_visited[bi, hh, t] == len(keys)
    as_mask = selection_mask(blocks, block_size=3).repeat_interleave(2, dim=1)
    again = selection_stats(q, k, as_mask, scale=0.5)
    close(again.mass, stats.mass)
    assert torch.equal(again.keys_visited, stats.keys_visited)


def test_selection_stats_of_every_key_and_of_a_shared_selection(monkeypatch):
    q, k, v = qkv(1, 2, 1, 9, seed=1)
    every = torch.arange(9).expand(1, 9, 9)
    monkeypatch.setattr(ls, "_CHUNK_ELEMENTS", 1)
    stats = selection_stats(q, k, every)
    close(stats.mass, torch.ones(1, 2, 9, dtype=DT))
    assert stats.keys_visited[0, 1].tolist() == list(range(1, 10))
    picked = lightning_indexer(randn(1, 2, 9, 3), randn(1, 9, 3), top_k=3)
    shared = selection_stats(q, k, picked)
    assert shared.keys_visited.tolist() == [[[min(3, t + 1) for t in range(9)]] * 2]
    assert (shared.mass <= 1 + 1e-12).all() and (shared.mass > 0).all()


# ------------------------------------------------------------------ gradients


@pytest.mark.slow  # about 2 s of CPU: make test, not make check
def test_gradients_match_finite_differences():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, 7, d=3, e=2, seed=12))
    gates = tuple(rand(1, 2, 7, seed=s).requires_grad_() for s in range(3))
    iq, ik, iw = index_inputs(1, 2, 7, 3, seed=2)

    def nsa(q, k, v, gc, gs, gw):
        return native_sparse_attention(
            q,
            k,
            v,
            gate_compressed=gc,
            gate_selected=gs,
            gate_window=gw,
            block_size=2,
            num_selected_blocks=2,
            window_size=2,
        )

    assert torch.autograd.gradcheck(nsa, (q, k, v, *gates))
    assert torch.autograd.gradcheck(
        lambda q, k, v: moba_attention(q, k, v, block_size=2, top_k=2), (q, k, v)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=3),
        (q, k, v),
    )


def test_no_gradient_reaches_the_indexer():
    q, k, v = qkv(1, 2, 1, 6, seed=1)
    iq = randn(1, 2, 6, 3).requires_grad_()
    out = deepseek_sparse_attention(q, k, v, iq, randn(1, 6, 3), top_k=2)
    assert not out.requires_grad


# ------------------------------------------------------------------ shapes, sizes, NaN


def test_leading_batch_dims_are_flattened_and_restored():
    q, k, v = (
        randn(2, 3, 4, 10, 5),
        randn(2, 3, 2, 10, 5, seed=1),
        randn(1, 3, 2, 10, 4),
    )
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        block_size=3,
        num_selected_blocks=2,
        window_size=2,
        return_block_indices=True,
    )
    assert out.shape == (2, 3, 4, 10, 4) and blocks.shape == (2, 3, 2, 10, 2)
    close(
        out[1, 2],
        native_sparse_attention(
            q[1, 2][None],
            k[1, 2][None],
            v[0, 2][None],
            block_size=3,
            num_selected_blocks=2,
            window_size=2,
        )[0],
    )
    out = moba_attention(q, k, v, block_size=3, top_k=2)
    close(out[0, 1], moba_attention(q[0, 1], k[0, 1], v[0, 1], block_size=3, top_k=2))
    iq, ik = randn(3, 2, 10, 3), randn(1, 10, 3)  # the index tensors broadcast too
    out, picked = deepseek_sparse_attention(
        q, k, v, iq, ik, top_k=3, return_indices=True
    )
    assert out.shape == (2, 3, 4, 10, 4) and picked.shape == (2, 3, 10, 3)
    close(
        out[1, 0],
        deepseek_sparse_attention(q[1, 0], k[1, 0], v[0, 0], iq[0], ik[0], top_k=3),
    )


def test_sizes_beyond_the_sequence_are_clamped():
    q, k, v = qkv(1, 2, 1, 6, seed=3)
    big = 2**80  # beyond int64: clamped before any arithmetic
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        block_size=big,
        num_selected_blocks=big,
        window_size=big,
        return_block_indices=True,
    )
    assert blocks.shape == (1, 1, 6, 1)
    # one block, not complete before the end: the selected and window branches are both
    # full causal attention and the compressed branch is 0
    close(out, 2 * full_causal(q, k, v))
    out, blocks = moba_attention(
        q, k, v, block_size=big, top_k=big, return_block_indices=True
    )
    assert blocks.shape == (1, 2, 6, 1)
    close(out, full_causal(q, k, v))
    picked = lightning_indexer(randn(1, 2, 6, 3), randn(1, 6, 3), top_k=big)
    assert picked.shape == (1, 6, 6)
    whole = torch.zeros(1, 6, 1, dtype=torch.long)  # block 0 for every query
    causal = torch.ones(1, 6, 6, dtype=torch.bool).tril()
    assert torch.equal(selection_mask(whole, block_size=big), causal)
    close(
        selection_stats(q, k, whole, block_size=big).mass, torch.ones(1, 2, 6, dtype=DT)
    )


def test_empty_sequence():
    q, k, v = qkv(1, 2, 1, 0)
    assert native_sparse_attention(q, k, v, window_size=3).shape == (1, 2, 0, 3)
    assert moba_attention(q, k, v, block_size=2, top_k=2).shape == (1, 2, 0, 3)
    out = deepseek_sparse_attention(q, k, v, randn(1, 2, 0, 3), randn(1, 0, 3), top_k=2)
    assert out.shape == (1, 2, 0, 3)


def test_nan_in_a_query_reaches_its_row_only():
    q, k, v = qkv(1, 2, 1, 12, seed=4)
    q[0, 1, 7, 0] = float("nan")
    iq, ik, iw = index_inputs(1, 2, 12, 3)
    outs = [
        native_sparse_attention(
            q, k, v, block_size=3, num_selected_blocks=2, window_size=2
        ),
        moba_attention(q, k, v, block_size=3, top_k=2),
        deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=3),
    ]
    for out in outs:
        bad = out.isnan().any(-1)
        assert bad[0, 1, 7] and bad.sum() == 1


def test_nan_key_makes_every_row_nan_as_the_dense_form():
    """A NaN score poisons its row even against a future or skipped key, as in torch."""
    q, k, v = qkv(1, 2, 1, 12, seed=5)
    k[0, 0, 10, 1] = float("nan")
    iq, ik, iw = index_inputs(1, 2, 12, 3)
    outs = [
        native_sparse_attention(q, k, v, block_size=3, num_selected_blocks=2),
        moba_attention(q, k, v, block_size=3, top_k=2),
        deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=3),
    ]
    refs = [
        ls._nsa_dense_reference(q, k, v, (None,) * 3, 3, 2, 0)[0],
        ls._moba_dense_reference(q, k, v, 3, 2),
        ls._dsa_dense_reference(q, k, v, iq, ik, iw, 3),
    ]
    for out, ref in zip(outs, refs, strict=True):
        assert out.isnan().all() and ref.isnan().all()


def test_nan_value_in_nsa_reaches_only_the_queries_at_or_after_it():
    q, k, v = qkv(1, 2, 1, 12, seed=7)
    v[0, 0, 10, 1] = float("nan")  # in block 3 (positions 9-11), complete at t = 11
    out = native_sparse_attention(q, k, v, block_size=3, num_selected_blocks=2)
    assert out[..., :10, :].isfinite().all() and out[..., 10:, :].isnan().any(-1).all()


def test_nan_value_reaches_only_the_queries_that_select_it():
    q, k, v = qkv(1, 2, 1, 12, seed=6)
    v[0, 0, 2, 0] = float("nan")
    iq, ik, iw = index_inputs(1, 2, 12, 3)
    out, picked = deepseek_sparse_attention(
        q, k, v, iq, ik, iw, top_k=3, return_indices=True
    )
    uses = (picked[0] == 2).any(-1)  # (n,)
    assert torch.equal(out[0, 0].isnan().any(-1), uses) and not uses.all()
    out, blocks = moba_attention(
        q, k, v, block_size=3, top_k=2, return_block_indices=True
    )
    uses = (blocks[0] == 0).any(-1) & (torch.arange(12) >= 2)  # (h, n)
    assert torch.equal(out[0].isnan().any(-1), uses) and not uses.all()


# ------------------------------------------------------------------ bad input


def test_bad_inputs_are_refused_with_the_rule_and_the_values():
    q, k, v = qkv(1, 4, 2, 8)
    with pytest.raises(
        ValueError, match="multiple of the key/value heads h_kv.*h=4 and h_kv=3"
    ):
        moba_attention(q, randn(1, 3, 8, 5), randn(1, 3, 8, 3), block_size=2, top_k=2)
    with pytest.raises(ValueError, match="same number of positions n, got 8 and 7"):
        native_sparse_attention(q, k[..., :7, :], v[..., :7, :])
    with pytest.raises(ValueError, match="heads axis"):
        moba_attention(q[0, 0], k[0, 0], v[0, 0], block_size=2, top_k=2)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        moba_attention(q, k, v, block_size=0, top_k=2)
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        moba_attention(q, k, v, block_size=2, top_k=0)
    with pytest.raises(TypeError, match="num_selected_blocks must be an int, got bool"):
        native_sparse_attention(q, k, v, num_selected_blocks=True)
    with pytest.raises(ValueError, match="window_size must be >= 0, got -1"):
        native_sparse_attention(q, k, v, window_size=-1)
    with pytest.raises(
        ValueError, match=r"gate_window and the \(\.\.\., h, n\) queries must"
    ):
        native_sparse_attention(q, k, v, gate_window=torch.ones(1, 4, 7, dtype=DT))
    with pytest.raises(
        ValueError, match=r"gate_window must broadcast to the \(\.\.\., h, n\)"
    ):
        native_sparse_attention(q, k, v, gate_window=torch.ones(2, 1, 4, 8, dtype=DT))
    with pytest.raises(TypeError, match="query and gate_selected must share a dtype"):
        native_sparse_attention(q, k, v, gate_selected=torch.ones(1, 4, 8))
    with pytest.raises(TypeError, match="return_block_indices must be a bool"):
        native_sparse_attention(q, k, v, return_block_indices=1)
    with pytest.raises(TypeError, match="query and key must share a dtype"):
        moba_attention(q, k.float(), v, block_size=2, top_k=1)


def test_bad_indexer_inputs_are_refused():
    q, k, v = qkv(1, 4, 2, 8)
    iq, ik = randn(1, 2, 8, 3), randn(1, 8, 3)
    with pytest.raises(
        ValueError, match="one key per token, shared by the indexer heads"
    ):
        lightning_indexer(iq, randn(1, 2, 8, 3), top_k=2)
    with pytest.raises(ValueError, match=r"index_key must have one row of size d_i"):
        lightning_indexer(iq, randn(1, 8, 4), top_k=2)
    with pytest.raises(
        ValueError, match=r"index_weights must have shape \(\.\.\., h_i, n\)"
    ):
        lightning_indexer(iq, ik, randn(1, 8, 2), top_k=2)
    with pytest.raises(
        TypeError, match="activation must be None \\(ReLU\\) or a callable"
    ):
        lightning_indexer(iq, ik, top_k=2, activation="relu")
    with pytest.raises(ValueError, match="activation must map"):
        lightning_indexer(iq, ik, top_k=2, activation=lambda s: s.sum(-1))
    with pytest.raises(ValueError, match="index_query must have one row per position"):
        deepseek_sparse_attention(q, k, v, randn(1, 2, 7, 3), randn(1, 7, 3), top_k=2)
    with pytest.raises(ValueError, match="batch dims .* must broadcast to the query's"):
        deepseek_sparse_attention(q, k, v, randn(3, 2, 8, 3), ik, top_k=2)
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        deepseek_sparse_attention(q, k, v, iq, ik, top_k=0)
    with pytest.raises(TypeError, match="return_indices must be a bool"):
        deepseek_sparse_attention(q, k, v, iq, ik, top_k=2, return_indices="yes")


def test_bad_selections_are_refused():
    q, k, _ = qkv(1, 4, 2, 8)
    with pytest.raises(
        ValueError, match=r"indices must lie in \[-1, 3\].*from -1 to 4"
    ):
        selection_mask(torch.tensor([[4, -1]] * 8), block_size=2)
    with pytest.raises(TypeError, match="indices must have an integer dtype"):
        selection_mask(torch.zeros(8, 2))
    with pytest.raises(
        ValueError, match="selection's heads must divide the query heads"
    ):
        selection_stats(q, k, torch.zeros(1, 3, 8, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="selection must have one row per query"):
        selection_stats(q, k, torch.zeros(1, 7, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="selection and the .* scores must broadcast"):
        selection_stats(q, k, torch.ones(8, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean selection must broadcast to the"):
        selection_stats(q, k, torch.ones(3, 1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="selection must have an integer dtype"):
        selection_stats(q, k, torch.ones(1, 8, 2))
