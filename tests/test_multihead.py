"""Tests for attention.layers.multihead: parity with nn.MultiheadAttention, the one path
through attention_fn, a head size independent of the number of heads, GQA/MQA against
explicitly repeated heads, head splitting, gradients, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from attention import (
    MultiHeadAttention,
    RotaryConfig,
    causal_mask,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)

DT = torch.float64


def _torch_mha(embed_dim, num_heads, *, kdim=None, vdim=None, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(
        embed_dim,
        num_heads,
        batch_first=True,
        kdim=kdim,
        vdim=vdim,
        bias=bias,
        dtype=DT,
    )
    if bias:  # torch initialises the biases to zero; make them matter
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return ref.eval()


def _inputs(b, i, j, embed_dim, kdim, vdim, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, i, embed_dim, generator=g, dtype=DT)
    k = torch.randn(b, j, kdim, generator=g, dtype=DT)
    v = torch.randn(b, j, vdim, generator=g, dtype=DT)
    return q, k, v


# --------------------------------------------------------------- split / merge / repeat


@given(
    b=st.integers(1, 3),
    length=st.integers(1, 6),
    h=st.integers(1, 4),
    d=st.integers(1, 5),
)
@settings(max_examples=30, deadline=None)
def test_split_merge_round_trip(b, length, h, d):
    x = torch.randn(b, length, h * d, dtype=DT)
    heads = split_heads(x, h)
    assert heads.shape == (b, h, length, d)
    assert torch.equal(merge_heads(heads), x)


def test_split_heads_gives_each_head_its_slice_of_features():
    x = torch.randn(2, 5, 12, dtype=DT)
    heads = split_heads(x, 3)
    for n in range(3):
        assert torch.equal(heads[:, n], x[..., 4 * n : 4 * n + 4])


def test_split_heads_rejects_indivisible_features():
    with pytest.raises(ValueError, match="divisible by num_heads, got 10 and 3"):
        split_heads(torch.randn(1, 2, 10), 3)


def test_merge_heads_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"shape \(b, h, L, d\)"):
        merge_heads(torch.randn(2, 3, 4))


# ---------------------------------------------------------------- structure


def test_submodules_and_attributes():
    m = MultiHeadAttention(24, 6, kdim=10, vdim=14, num_kv_heads=2)
    assert (m.embed_dim, m.num_heads, m.num_kv_heads, m.head_dim) == (24, 6, 2, 4)
    for name, shape in (
        ("w_query", (24, 24)),
        ("w_key", (8, 10)),
        ("w_value", (8, 14)),
        ("w_out", (24, 24)),
    ):
        layer = getattr(m, name)
        assert isinstance(layer, nn.Linear)
        assert tuple(layer.weight.shape) == shape
    assert m.w_query.bias is not None
    assert MultiHeadAttention(8, 2, bias=False).w_out.bias is None


# ---------------------------------------------------------------- parity with torch


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(None, None), (10, 7)], ids=["packed", "kdim-vdim"])
def test_parity_with_torch(bias, dims):
    kdim, vdim = dims
    ref = _torch_mha(12, 3, kdim=kdim, vdim=vdim, bias=bias)
    ours = MultiHeadAttention.from_torch(ref).eval()
    q, k, v = _inputs(2, 5, 7, 12, kdim or 12, vdim or 12)
    out_ref, w_ref = ref(q, k, v, need_weights=True)
    out, w = ours(q, k, v, need_weights=True)
    assert_close(out, out_ref)
    assert_close(w.mean(1), w_ref)
    out_fused, none = ours(q, k, v)
    assert none is None
    assert_close(out_fused, out_ref)
    _, w_heads = ref(q, k, v, need_weights=True, average_attn_weights=False)
    assert_close(w, w_heads)


def test_parity_with_torch_self_attention_fast_path():
    ref = _torch_mha(16, 4)
    ours = MultiHeadAttention.from_torch(ref)
    x = torch.randn(3, 6, 16, dtype=DT)
    with torch.inference_mode():  # lets torch take its fused fast path
        out_ref, _ = ref(x, x, x, need_weights=False)
        out, _ = ours(x, x, x)
    assert_close(out, out_ref)


@pytest.mark.parametrize("fused", [True, False])
def test_parity_with_torch_masks(fused):
    """Our masks say True = may attend; torch's attn_mask and key_padding_mask say True
    = blocked."""
    ref = _torch_mha(12, 3)
    ours = MultiHeadAttention.from_torch(ref)
    q, k, v = _inputs(2, 5, 5, 12, 12, 12)
    causal = causal_mask(5)  # (i, j)
    pad = padding_mask([5, 3], 5)  # (b, 1, 1, j)
    out_ref, w_ref = ref(q, k, v, attn_mask=~causal, key_padding_mask=~pad[:, 0, 0])
    out, w = ours(q, k, v, attn_mask=causal & pad, need_weights=not fused)
    assert_close(out, out_ref)
    if not fused:
        assert_close(w.mean(1), w_ref)


def test_parity_with_torch_float_mask():
    ref = _torch_mha(12, 4)
    ours = MultiHeadAttention.from_torch(ref)
    q, k, v = _inputs(2, 3, 6, 12, 12, 12)
    bias = torch.randn(3, 6, dtype=DT)
    out_ref, w_ref = ref(q, k, v, attn_mask=bias)
    out, w = ours(q, k, v, attn_mask=bias, need_weights=True)
    assert_close(out, out_ref)
    assert_close(w.mean(1), w_ref)


def test_parity_with_torch_is_causal():
    ref = _torch_mha(12, 3)
    ours = MultiHeadAttention.from_torch(ref)
    x = torch.randn(2, 6, 12, dtype=DT)
    out_ref, _ = ref(x, x, x, attn_mask=~causal_mask(6), need_weights=False)
    assert_close(ours(x, x, x, is_causal=True)[0], out_ref)
    assert_close(ours(x, x, x, is_causal=True, need_weights=True)[0], out_ref)


def test_from_torch_rejects_bias_kv():
    ref = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    with pytest.raises(
        ValueError, match="add_bias_kv and add_zero_attn are not supported"
    ):
        MultiHeadAttention.from_torch(ref)


def test_from_torch_rejects_other_modules():
    with pytest.raises(TypeError, match="must be an nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))


# -------------------------------------------------------------- fused vs reference path


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("masking", ["none", "causal", "bool", "float"])
def test_fused_equals_reference_path(num_kv_heads, masking):
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, dtype=DT).eval()
    q, k, v = _inputs(2, 5, 5, 16, 16, 16)
    kwargs = {
        "none": {},
        "causal": {"is_causal": True},
        "bool": {"attn_mask": padding_mask([5, 2], 5) & causal_mask(5)},
        "float": {"attn_mask": torch.randn(2, 4, 5, 5, dtype=DT)},
    }[masking]
    fused, _ = m(q, k, v, **kwargs)
    ref, w = m(q, k, v, need_weights=True, **kwargs)
    assert_close(fused, ref)
    assert w.shape == (2, 4, 5, 5)
    assert_close(w.sum(-1), torch.ones(2, 4, 5, dtype=DT))


def test_fully_masked_row_gives_zero_context_in_both_paths():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dtype=DT, bias=False)
    x = torch.randn(1, 3, 8, dtype=DT)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    fused, _ = m(x, x, x, attn_mask=mask)
    ref, w = m(x, x, x, attn_mask=mask, need_weights=True)
    assert_close(fused, ref)
    assert torch.equal(w[0, :, 1], torch.zeros(2, 3, dtype=DT))
    assert torch.equal(ref[0, 1], torch.zeros(8, dtype=DT))  # no bias: zero output


def test_matches_naive_loop_over_heads():
    """Head n is attention with the n-th block of rows of each projection matrix."""
    torch.manual_seed(0)
    m = MultiHeadAttention(12, 3, kdim=5, vdim=6, dtype=DT)
    q, k, v = _inputs(2, 4, 7, 12, 5, 6)
    d = m.head_dim
    heads = []
    for n in range(3):
        rows = slice(n * d, (n + 1) * d)
        qn = q @ m.w_query.weight[rows].T + m.w_query.bias[rows]
        kn = k @ m.w_key.weight[rows].T + m.w_key.bias[rows]
        vn = v @ m.w_value.weight[rows].T + m.w_value.bias[rows]
        heads.append(scaled_dot_product_attention(qn, kn, vn))
    expected = m.w_out(torch.cat(heads, dim=-1))
    assert_close(m(q, k, v)[0], expected)


# ---------------------------------------------------------------- GQA / MQA


@pytest.mark.parametrize("num_kv_heads", [1, 2, 3, 6])
@pytest.mark.parametrize("need_weights", [False, True])
def test_gqa_equals_mha_with_repeated_kv_heads(num_kv_heads, need_weights):
    """GQA is MHA whose key/value projections repeat each kv head's rows for its
    group."""
    torch.manual_seed(0)
    h, d = 6, 4
    gqa = MultiHeadAttention(h * d, h, num_kv_heads=num_kv_heads, dtype=DT)
    mha = MultiHeadAttention(h * d, h, dtype=DT)
    groups = h // num_kv_heads
    with torch.no_grad():
        for name in ("w_query", "w_out"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("w_key", "w_value"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            w = src.weight.reshape(num_kv_heads, d, -1).repeat_interleave(groups, dim=0)
            dst.weight.copy_(w.reshape(h * d, -1))
            dst.bias.copy_(
                src.bias.reshape(num_kv_heads, d).repeat_interleave(groups, 0).flatten()
            )
    x = torch.randn(2, 5, h * d, dtype=DT)
    out_g, w_g = gqa(x, x, x, is_causal=True, need_weights=need_weights)
    out_m, w_m = mha(x, x, x, is_causal=True, need_weights=need_weights)
    assert_close(out_g, out_m)
    if need_weights:
        assert_close(w_g, w_m)


def test_gqa_has_fewer_key_value_parameters():
    mha = MultiHeadAttention(32, 8)
    mqa = MultiHeadAttention(32, 8, num_kv_heads=1)
    assert mha.w_key.weight.numel() == 8 * mqa.w_key.weight.numel()


# ---------------------------------------------------------------- dropout, gradients


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dropout=0.5, dtype=DT)
    x = torch.randn(2, 4, 8, dtype=DT)
    m.eval()
    assert_close(m(x, x, x)[0], m(x, x, x)[0])
    m.train()
    torch.manual_seed(1)
    a = m(x, x, x, need_weights=True)[0]
    torch.manual_seed(2)
    b = m(x, x, x, need_weights=True)[0]
    assert not torch.allclose(a, b)
    m.eval()
    assert_close(m(x, x, x)[0], m(x, x, x, need_weights=True)[0])


@pytest.mark.parametrize("need_weights", [False, True])
def test_gradients_flow_to_inputs_and_every_projection(need_weights):
    torch.manual_seed(0)
    m = MultiHeadAttention(12, 3, num_kv_heads=1, kdim=5, vdim=6, dtype=DT)
    q, k, v = (t.requires_grad_() for t in _inputs(2, 4, 6, 12, 5, 6))
    out, _ = m(q, k, v, need_weights=need_weights)
    out.square().sum().backward()
    for t in (q, k, v, *m.parameters()):
        assert (
            t.grad is not None
            and torch.isfinite(t.grad).all()
            and t.grad.abs().sum() > 0
        )


def test_gradients_of_both_paths_agree():
    torch.manual_seed(0)
    m = MultiHeadAttention(12, 3, dtype=DT)
    x = torch.randn(2, 5, 12, dtype=DT)
    grads = []
    for need_weights in (False, True):
        m.zero_grad()
        m(x, x, x, is_causal=True, need_weights=need_weights)[0].sum().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        assert_close(a, b)


def test_gradcheck():
    torch.manual_seed(0)
    m = MultiHeadAttention(6, 2, num_kv_heads=1, dtype=DT)
    x = torch.randn(1, 3, 6, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: m(t, t, t, is_causal=True, need_weights=True)[0], (x,)
    )


def test_permutation_equivariance_without_mask():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dtype=DT)
    x = torch.randn(1, 5, 8, dtype=DT)
    perm = torch.randperm(5)
    assert_close(m(x[:, perm], x[:, perm], x[:, perm])[0], m(x, x, x)[0][:, perm])


def test_fused_path_agrees_with_functional_sdpa_in_float32():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4)
    x = torch.randn(2, 9, 32)
    q = split_heads(m.w_query(x), 4)
    k = split_heads(m.w_key(x), 4)
    v = split_heads(m.w_value(x), 4)
    expected = m.w_out(
        merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    )
    assert_close(m(x, x, x, is_causal=True)[0], expected)


# ---------------------------------------------------------------- bad input


def test_rejects_embed_dim_not_divisible_by_num_heads():
    with pytest.raises(
        ValueError,
        match="embed_dim must be divisible by num_heads when head_dim is not given, "
        "got 10 and 3",
    ):
        MultiHeadAttention(10, 3)
    assert MultiHeadAttention(10, 3, head_dim=4).w_query.out_features == 12


def test_rejects_num_heads_not_divisible_by_num_kv_heads():
    with pytest.raises(
        ValueError, match="num_heads must be divisible by num_kv_heads.*got 6 and 4"
    ):
        MultiHeadAttention(12, 6, num_kv_heads=4)


def test_rejects_bad_dropout():
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\], got 1.5"):
        MultiHeadAttention(8, 2, dropout=1.5)


@pytest.mark.parametrize(
    "which, message",
    [
        ("query", "query's last dimension must equal embed_dim=8, got 5"),
        ("key", "key's last dimension must equal kdim=6, got 5"),
        ("value", "value's last dimension must equal vdim=7, got 5"),
    ],
)
def test_rejects_wrong_feature_size(which, message):
    m = MultiHeadAttention(8, 2, kdim=6, vdim=7)
    args = {
        "query": torch.randn(1, 3, 8),
        "key": torch.randn(1, 4, 6),
        "value": torch.randn(1, 4, 7),
    }
    args[which] = torch.randn(1, 4 if which != "query" else 3, 5)
    with pytest.raises(ValueError, match=message):
        m(**args)


def test_rejects_unbatched_input():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"batch-first with shape \(b, L, embed_dim\)"):
        m(x, x, x)


def test_rejects_mismatched_batch():
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="same batch size, got 2, 3 and 3"):
        m(torch.randn(2, 4, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8))


def test_rejects_key_value_length_mismatch():
    m = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="same number of positions j, got 4 and 5"):
        m(torch.randn(2, 3, 8), torch.randn(2, 4, 8), torch.randn(2, 5, 8))


def test_rejects_mask_that_does_not_broadcast():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(
        ValueError, match=r"attn_mask of shape \(3, 4\) does not broadcast"
    ):
        m(x, x, x, attn_mask=torch.ones(3, 4, dtype=torch.bool))


def test_rejects_integer_mask():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="attn_mask must be boolean"):
        m(x, x, x, attn_mask=torch.ones(4, 4, dtype=torch.long))


def test_rejects_is_causal_with_attn_mask():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    with pytest.raises(
        ValueError, match="either attn_mask or is_causal=True, not both"
    ):
        m(x, x, x, attn_mask=causal_mask(4), is_causal=True)


def test_rejects_non_tensor_input():
    m = MultiHeadAttention(8, 2)
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got list"):
        m([[0.0] * 8], torch.randn(1, 1, 8), torch.randn(1, 1, 8))


@pytest.mark.parametrize("need_weights", [False, True])
def test_sequence_first_matches_torch(need_weights):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(
        12, 3, batch_first=False, kdim=5, vdim=7, dtype=DT
    ).eval()
    with torch.no_grad():
        ref.out_proj.bias.normal_()
    ours = MultiHeadAttention.from_torch(ref)
    seq_first = MultiHeadAttention(
        12, 3, kdim=5, vdim=7, batch_first=False, dtype=DT
    ).eval()
    seq_first.load_state_dict(ours.state_dict())
    q, k, v = (
        torch.randn(4, 2, 12, dtype=DT),
        torch.randn(6, 2, 5, dtype=DT),
        torch.randn(6, 2, 7, dtype=DT),
    )
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    expected, expected_w = ref(q, k, v, attn_mask=~mask)
    out, w = seq_first(q, k, v, attn_mask=mask, need_weights=need_weights)
    assert out.shape == (4, 2, 12)
    assert_close(out, expected)
    if need_weights:
        assert_close(w.mean(1), expected_w)
    assert "batch_first=False" in repr(seq_first)
    with pytest.raises(
        ValueError, match=r"sequence-first with shape \(L, b, embed_dim\)"
    ):
        seq_first(q[0], k, v)
    for one_d in (q[0, 0], torch.randn(12, dtype=DT)):  # checked before transposing
        with pytest.raises(ValueError, match=r"query must be sequence-first"):
            seq_first(one_d, k, v)
    with pytest.raises(ValueError, match="same batch size, got 2, 3 and 3"):
        seq_first(q, torch.randn(6, 3, 5, dtype=DT), torch.randn(6, 3, 7, dtype=DT))


def test_attention_fn_puts_another_kernel_inside():
    from functools import partial

    from attention import (
        attention_with_sinks,
        scaled_dot_product_attention,
        tiled_attention,
    )

    torch.manual_seed(0)
    ref = MultiHeadAttention(16, 4, num_kv_heads=2, dtype=DT).eval()
    x = torch.randn(2, 7, 16, dtype=DT, requires_grad=True)
    mask = torch.rand(7, 7) > 0.4
    for fn in (
        tiled_attention,
        partial(tiled_attention, block_size=3),
        scaled_dot_product_attention,
    ):
        mha = MultiHeadAttention(
            16, 4, num_kv_heads=2, dtype=DT, attention_fn=fn
        ).eval()
        mha.load_state_dict(ref.state_dict())
        for kwargs in ({"is_causal": True}, {"attn_mask": mask}, {}):
            out, w = mha(x, x, x, **kwargs)
            expected, _ = ref(x, x, x, **kwargs)
            assert w is None
            assert_close(out, expected)
            g1 = torch.autograd.grad(out.sum(), (x, *mha.parameters()))
            g2 = torch.autograd.grad(expected.sum(), (x, *ref.parameters()))
            for a, b in zip(g1, g2):
                assert_close(a, b)
    cache_mha = MultiHeadAttention(
        16,
        4,
        num_kv_heads=2,
        dtype=DT,
        attention_fn=partial(tiled_attention, block_size=2),
    )
    cache_mha.load_state_dict(ref.state_dict())
    cache = cache_mha.new_cache(2, 7)
    with torch.no_grad():
        full, _ = ref(x, x, x, is_causal=True)
        pieces = [
            cache_mha(x[:, :4], x[:, :4], x[:, :4], is_causal=True, cache=cache)[0]
        ]
        pieces += [
            cache_mha(
                x[:, t : t + 1],
                x[:, t : t + 1],
                x[:, t : t + 1],
                is_causal=True,
                cache=cache,
            )[0]
            for t in range(4, 7)
        ]
    assert_close(torch.cat(pieces, 1), full)
    # a kernel with its own options: sinks that no query attends to change nothing
    sinks = MultiHeadAttention(
        16,
        4,
        num_kv_heads=2,
        dtype=DT,
        attention_fn=partial(
            attention_with_sinks, sinks=torch.full((4,), -torch.inf, dtype=DT)
        ),
    )
    sinks.load_state_dict(ref.state_dict())
    with torch.no_grad():
        assert_close(sinks(x, x, x, is_causal=True)[0], ref(x, x, x, is_causal=True)[0])
    assert "attention_fn=tiled_attention" in repr(
        MultiHeadAttention(16, 4, attention_fn=tiled_attention)
    )


def test_attention_fn_refusals():
    from attention import tiled_attention

    with pytest.raises(
        TypeError, match="attention_fn must be callable or None, got int"
    ):
        MultiHeadAttention(8, 2, attention_fn=3)
    with pytest.raises(
        ValueError,
        match="dropout=0.1 is passed to attention_fn as dropout_p, which "
        "tiled_attention does not take",
    ):
        MultiHeadAttention(8, 2, attention_fn=tiled_attention, dropout=0.1)
    x = torch.randn(1, 3, 8)
    with pytest.raises(
        ValueError,
        match="need_weights=True returns the softmax weights of the reference",
    ):
        MultiHeadAttention(8, 2, attention_fn=tiled_attention)(
            x, x, x, need_weights=True
        )


def test_attention_fn_that_returns_a_tuple_or_a_wrong_shape_is_named():
    from functools import partial

    from attention import tiled_attention

    x = torch.randn(1, 3, 8)
    pair = MultiHeadAttention(
        8, 2, attention_fn=partial(tiled_attention, return_lse=True)
    )
    with pytest.raises(
        TypeError, match=r"must return one tensor \(b, h, i, d\), got tuple"
    ):
        pair(x, x, x)
    wrong = MultiHeadAttention(8, 2, attention_fn=lambda q, k, v, **kw: q[..., :1, :])
    with pytest.raises(
        ValueError,
        match=r"must return the shape \(b, h, i, d\) = \(1, 2, 3, 4\) .* got "
        r"\(1, 2, 1, 4\)",
    ):
        wrong(x, x, x)


def test_dropout_reaches_a_kernel_that_takes_dropout_p():
    """The package's reference takes dropout_p like torch's SDPA: both run dropout."""
    torch.manual_seed(0)
    m = MultiHeadAttention(
        8, 2, dropout=0.5, attention_fn=scaled_dot_product_attention, dtype=DT
    ).train()
    x = torch.randn(1, 6, 8, dtype=DT)
    torch.manual_seed(1)
    a = m(x, x, x)[0]
    torch.manual_seed(2)
    b = m(x, x, x)[0]
    assert not torch.allclose(a, b)
    m.eval()
    assert_close(m(x, x, x)[0], m(x, x, x)[0])


def test_the_weights_returned_are_the_ones_the_output_is_made_of():
    """need_weights computes the reference weights beside the kernel's output: merging
    their heads' weighted values and projecting gives the output."""
    torch.manual_seed(0)
    m = MultiHeadAttention(12, 3, num_kv_heads=1, dtype=DT).eval()
    x = torch.randn(2, 5, 12, dtype=DT)
    mask = torch.rand(5, 5) > 0.3
    out, w = m(x, x, x, attn_mask=mask, need_weights=True)
    v = split_heads(m.w_value(x), 1)  # (b, 1, j, d): one key/value head for all three
    assert_close(out, m.w_out(merge_heads(w @ v)))


# ---------------------------------------------------------------- head_dim


def test_head_dim_independent_of_embed_dim_matches_a_hand_written_reference():
    """Gemma's layout: the heads' total size h·d differs from the model size (here 4
    heads of 6 on a model of 16, with 2 key/value heads), so w_query maps 16 -> 24 and
    w_out 24 -> 16. The reference is written out head by head from the weights."""
    torch.manual_seed(0)
    h, h_kv, d, embed = 4, 2, 6, 16
    m = MultiHeadAttention(embed, h, head_dim=d, num_kv_heads=h_kv, dtype=DT).eval()
    assert (m.w_query.out_features, m.w_key.out_features, m.w_out.in_features) == (
        h * d,
        h_kv * d,
        h * d,
    )
    x = torch.randn(2, 7, embed, dtype=DT)
    heads = []
    for n in range(h):
        g = n // (h // h_kv)  # the key/value head query head n reads
        rows, kv_rows = slice(n * d, (n + 1) * d), slice(g * d, (g + 1) * d)
        qn = x @ m.w_query.weight[rows].T + m.w_query.bias[rows]  # (b, i, d)
        kn = x @ m.w_key.weight[kv_rows].T + m.w_key.bias[kv_rows]
        vn = x @ m.w_value.weight[kv_rows].T + m.w_value.bias[kv_rows]
        scores = qn @ kn.transpose(-2, -1) / d**0.5
        scores = scores.masked_fill(
            ~torch.ones(7, 7, dtype=torch.bool).tril(), -torch.inf
        )
        heads.append(torch.softmax(scores, -1) @ vn)
    expected = torch.cat(heads, -1) @ m.w_out.weight.T + m.w_out.bias
    out, w = m(x, x, x, is_causal=True, need_weights=True)
    assert out.shape == (2, 7, embed) and w.shape == (2, h, 7, 7)
    assert_close(out, expected)
    cache = m.new_cache(2, 7)
    with torch.no_grad():
        steps = [m(x[:, :3], x[:, :3], x[:, :3], is_causal=True, cache=cache)[0]]
        for t in range(3, 7):
            xt = x[:, t : t + 1]
            steps.append(m(xt, xt, xt, is_causal=True, cache=cache)[0])
    assert_close(torch.cat(steps, 1), expected)


def test_head_dim_equal_to_embed_dim_over_heads_is_torch_layout():
    ref = _torch_mha(12, 3)
    ours = MultiHeadAttention(12, 3, head_dim=4, dtype=DT).eval()
    ours.load_state_dict(MultiHeadAttention.from_torch(ref).state_dict())
    q, k, v = _inputs(2, 5, 6, 12, 12, 12)
    assert_close(ours(q, k, v)[0], ref(q, k, v)[0])


def test_rejects_bad_head_dim():
    with pytest.raises(ValueError, match="head_dim must be >= 1, got 0"):
        MultiHeadAttention(8, 2, head_dim=0)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        MultiHeadAttention(8, 2, head_dim=4.0)
    with pytest.raises(ValueError, match="head_dim must be even, got 3"):
        MultiHeadAttention(8, 2, head_dim=3, rope=RotaryConfig())


# ---------------------------------------------------------------- RoPE, one way


def test_rope_is_given_only_as_a_rotary_config():
    with pytest.raises(
        TypeError, match="rope must be a RotaryConfig or None, got bool"
    ):
        MultiHeadAttention(8, 2, rope=True)
    with pytest.raises(TypeError, match="rope_base"):
        MultiHeadAttention(8, 2, rope_base=10.0)
    assert MultiHeadAttention(8, 2).rope is None
    assert MultiHeadAttention(8, 2, rope=RotaryConfig(base=50.0)).rope.base == 50.0


# --------------------------------------------------------- one contract, every boundary


def test_flags_must_be_real_bools():
    m = MultiHeadAttention(8, 2).to(DT)
    x = torch.randn(1, 3, 8, dtype=DT)
    with pytest.raises(TypeError, match="need_weights must be a bool .* got str 'no'"):
        m(x, x, x, need_weights="no")
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        m(x, x, x, is_causal=1)
    with pytest.raises(TypeError, match="bias must be a bool"):
        MultiHeadAttention(8, 2, bias="yes")
    with pytest.raises(TypeError, match="batch_first must be a bool"):
        MultiHeadAttention(8, 2, batch_first=1)


def test_options_are_keyword_only():
    m = MultiHeadAttention(8, 2).to(DT)
    x = torch.randn(1, 3, 8, dtype=DT)
    with pytest.raises(TypeError, match="positional argument"):
        m(x, x, x, causal_mask(3))


def test_rejects_input_of_another_dtype_or_device():
    m = MultiHeadAttention(8, 2)  # float32 parameters
    x = torch.randn(1, 3, 8, dtype=DT)
    with pytest.raises(
        TypeError,
        match=r"query must have the dtype of the module's parameters "
        r"\(torch.float32\), got torch.float64",
    ):
        m(x, x, x)
    y = torch.randn(1, 3, 8)
    with pytest.raises(
        ValueError,
        match="key and the module's parameters must be on the same device, "
        "got meta and cpu",
    ):
        m(y, y.to("meta"), y)
    with pytest.raises(
        ValueError, match="query and attn_mask must be on the same device"
    ):
        m(y, y, y, attn_mask=causal_mask(3, device="meta"))
    with pytest.raises(
        TypeError, match="dtype must be a floating-point dtype, got torch.int64"
    ):
        MultiHeadAttention(8, 2, dtype=torch.int64)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("i, j", [(3, 0), (0, 4), (0, 0)])
def test_empty_query_or_key_axes_as_torch(i, j, need_weights):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=DT).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    q, kv = torch.randn(2, i, 8, dtype=DT), torch.randn(2, j, 8, dtype=DT)
    out, w = ours(q, kv, kv, need_weights=need_weights)
    assert out.shape == (2, i, 8)
    expected = F.scaled_dot_product_attention(
        ours.w_query(q).view(2, i, 2, 4).transpose(1, 2),
        ours.w_key(kv).view(2, j, 2, 4).transpose(1, 2),
        ours.w_value(kv).view(2, j, 2, 4).transpose(1, 2),
    )
    assert_close(out, ours.w_out(expected.transpose(1, 2).reshape(2, i, 8)))
    if need_weights:
        assert w.shape == (2, 2, i, j)


def test_nan_in_a_key_propagates_in_both_paths_as_in_torch():
    m = MultiHeadAttention(8, 2).to(DT).eval()
    x = torch.randn(1, 4, 8, dtype=DT)
    kv = x.clone()
    kv[0, 2, 0] = float("nan")
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[:, 2] = False  # masked, yet its NaN score reaches every row, as in torch
    fused, _ = m(x, kv, kv, attn_mask=mask)
    reference, _ = m(x, kv, kv, attn_mask=mask, need_weights=True)
    assert fused.isnan().all() and reference.isnan().all()
