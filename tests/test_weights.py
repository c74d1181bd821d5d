"""Tests for attention/reading/weights.py: sparsemax, 1.5-entmax, sigmoid, differential
attention and attention-weight refinement.

References: the ``entmax`` package (Peters, Niculae and Correia's implementation), naive
closed forms written here from the papers' equations, autograd through those closed
forms, ``gradcheck`` in float64, and the package's softmax attention.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import scaled_dot_product_attention
from attention.reading.weights import (
    DifferentialAttention,
    RefinedSelfAttention,
    differential_attention,
    differential_lambda_init,
    entmax15,
    sigmoid_attention,
    sparsemax,
)

entmax_package = pytest.importorskip(
    "entmax", reason="the test reference entmax is not installed"
)


# ---------------------------------------------------------------- naive references
def sparsemax_closed_form(z):
    """Martins & Astudillo (2016), Algorithm 1, with differentiable operations on a 1-d
    z."""
    ordered, _ = torch.sort(z, descending=True)
    k = torch.arange(1, z.numel() + 1, dtype=z.dtype)
    cumulative = ordered.cumsum(0)
    support = int((1 + k * ordered > cumulative).sum())
    tau = (cumulative[support - 1] - 1) / support
    return torch.clamp(z - tau, min=0)


def entmax15_closed_form(z):
    """Peters et al. (2019), the exact sort-based 1.5-entmax, on a 1-d z."""
    z = z / 2
    ordered, _ = torch.sort(z, descending=True)
    k = torch.arange(1, z.numel() + 1, dtype=z.dtype)
    mean = ordered.cumsum(0) / k
    mean_sq = (ordered**2).cumsum(0) / k
    delta = (1 - k * (mean_sq - mean**2)) / k
    tau = mean - torch.sqrt(torch.clamp(delta, min=0))
    support = int((tau <= ordered).sum())
    return torch.clamp(z - tau[support - 1], min=0) ** 2


rows = st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=12)


# ---------------------------------------------------------------- sparsemax / entmax
@settings(max_examples=60, deadline=None)
@given(rows)
def test_sparsemax_is_the_closed_form_and_a_distribution(values):
    z = torch.tensor(values, dtype=torch.float64)
    p = sparsemax(z)
    torch.testing.assert_close(p, sparsemax_closed_form(z), atol=1e-12, rtol=0)
    assert (p >= 0).all() and abs(p.sum().item() - 1) < 1e-12


@settings(max_examples=60, deadline=None)
@given(rows)
def test_entmax15_is_the_closed_form_and_a_distribution(values):
    z = torch.tensor(values, dtype=torch.float64)
    p = entmax15(z)
    torch.testing.assert_close(p, entmax15_closed_form(z), atol=1e-12, rtol=0)
    assert (p >= 0).all() and abs(p.sum().item() - 1) < 1e-12


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_both_equal_the_entmax_package_along_any_axis(dim):
    x = (
        torch.randn(
            5, 7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
        )
        * 3
    )
    torch.testing.assert_close(
        sparsemax(x, dim), entmax_package.sparsemax(x, dim=dim), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(
        entmax15(x, dim), entmax_package.entmax15(x, dim=dim), atol=1e-12, rtol=0
    )


def test_float32_entmax_agrees_with_float64():
    x = torch.randn(20, 9, generator=torch.Generator().manual_seed(1)) * 4
    torch.testing.assert_close(
        entmax15(x).double(), entmax15(x.double()), atol=2e-6, rtol=0
    )


@pytest.mark.parametrize(
    "fn, closed_form",
    [(sparsemax, sparsemax_closed_form), (entmax15, entmax15_closed_form)],
)
def test_jacobian_equals_autograd_through_the_closed_form(fn, closed_form):
    z = torch.tensor([1.3, 0.9, 0.4, -0.7, 2.1, 0.0], dtype=torch.float64)
    ours = torch.autograd.functional.jacobian(fn, z)
    reference = torch.autograd.functional.jacobian(closed_form, z)
    torch.testing.assert_close(ours, reference, atol=1e-10, rtol=0)


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_gradcheck(fn):
    # values well apart, so no entry sits on the support's boundary
    x = torch.tensor(
        [[1.3, 0.9, 0.4, -0.7, 2.1], [0.2, -1.5, 0.8, 0.5, -0.1]],
        dtype=torch.float64,
        requires_grad=True,
    )
    assert torch.autograd.gradcheck(lambda t: fn(t, 1), (x,))


def test_exact_zeros_where_softmax_is_positive():
    z = torch.tensor([3.0, 1.0, 0.2, -1.0])
    assert (sparsemax(z)[2:] == 0).all() and (entmax15(z)[3:] == 0).all()
    assert (torch.softmax(z, -1) > 0).all()


def test_sparsemax_masks_minus_inf_and_propagates_nan():
    p = sparsemax(torch.tensor([1.0, -math.inf, 0.5]))
    assert p[1] == 0 and abs(p.sum().item() - 1) < 1e-6
    assert torch.isnan(sparsemax(torch.tensor([1.0, math.nan, 0.5]))).all()


LARGE_LOGITS = [
    ([1e8, 0.0], torch.float32, [1.0, 0.0]),
    ([4096.0, 0.0], torch.float16, [1.0, 0.0]),
    ([512.0, 0.0], torch.bfloat16, [1.0, 0.0]),
    ([3e38, 3e38, 0.0], torch.float32, [0.5, 0.5, 0.0]),
    ([-3e38, 0.0, -3e38], torch.float32, [0.0, 1.0, 0.0]),
]


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
@pytest.mark.parametrize("values, dtype, exact", LARGE_LOGITS)
def test_large_logits_keep_their_answer(fn, values, dtype, exact):
    """Both maps are invariant to a shift of the row, so the row maximum is subtracted
    first: ``1 + k z`` and ``max z - 1`` no longer round away the 1 (which gave zeros
    or NaN). Checked against the exact answer and, outside float16 where the package
    itself fails, against the ``entmax`` package."""
    x = torch.tensor(values, dtype=dtype)
    p = fn(x)
    assert p.dtype == dtype
    torch.testing.assert_close(p, torch.tensor(exact, dtype=dtype), atol=0, rtol=0)
    if dtype != torch.float16:
        reference = getattr(entmax_package, fn.__name__)(x, dim=-1)
        torch.testing.assert_close(p, reference)  # the package rounds 0.5 to 0.49999997


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_zero_width_rows_give_the_empty_tensor_like_softmax(fn):
    """A row with no entries has nothing to normalise: the empty tensor comes back, as
    ``torch.softmax`` returns it (so shapes flow through code that allows empty
    axes)."""
    for x, dim in ((torch.empty(3, 0), -1), (torch.empty(0, 4), 0)):
        p = fn(x, dim)
        assert p.shape == x.shape == torch.softmax(x, dim).shape
        assert p.dtype == x.dtype
    x = torch.empty(2, 0, requires_grad=True)
    fn(x).sum().backward()
    assert x.grad.shape == (2, 0)


def test_sparsemax_rows_with_plus_inf_or_only_minus_inf_are_nan_like_softmax():
    for row in ([math.inf, 0.0], [-math.inf, -math.inf]):
        x = torch.tensor(row)
        assert (
            torch.isnan(torch.softmax(x, -1)).all() and torch.isnan(sparsemax(x)).all()
        )


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_normalisers_refuse_bad_input(fn):
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fn([1.0, 2.0])
    with pytest.raises(TypeError, match="floating"):
        fn(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="dim must lie"):
        fn(torch.randn(3), 2)
    with pytest.raises(ValueError, match="finite inputs"):
        entmax15(torch.tensor([1.0, -math.inf]))


# ---------------------------------------------------------------- sigmoid attention
def _qkv(seed=0, h=2, i=5, j=6, d=4, e=3, h_kv=None):
    g = torch.Generator().manual_seed(seed)
    h_kv = h_kv or h
    return (
        torch.randn(2, h, i, d, generator=g, dtype=torch.float64),
        torch.randn(2, h_kv, j, d, generator=g, dtype=torch.float64),
        torch.randn(2, h_kv, j, e, generator=g, dtype=torch.float64),
    )


def sigmoid_attention_naive(q, k, v, mask, scale, bias):
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                for j in range(k.shape[2]):
                    if mask is None or mask[i, j]:
                        w = 1 / (
                            1
                            + math.exp(-(scale * float(q[b, h, i] @ k[b, h, j]) + bias))
                        )
                        out[b, h, i] += w * v[b, h, j]
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_sigmoid_attention_equals_a_naive_loop(causal):
    q, k, v = _qkv()
    mask = torch.ones(5, 6, dtype=torch.bool).tril() if causal else None
    expected = sigmoid_attention_naive(q, k, v, mask, 0.5, -math.log(6))
    torch.testing.assert_close(
        sigmoid_attention(q, k, v, scale=0.5, is_causal=causal),
        expected,
        atol=1e-12,
        rtol=0,
    )
    torch.testing.assert_close(
        sigmoid_attention(q, k, v, scale=0.5, attn_mask=mask, bias=-math.log(6)),
        sigmoid_attention_naive(q, k, v, mask, 0.5, -math.log(6)),
        atol=1e-12,
        rtol=0,
    )


def test_sigmoid_attention_float_mask_enters_before_the_sigmoid_and_gqa_repeats_heads():
    q, k, v = _qkv(h=4, h_kv=2)
    bias = torch.randn(5, 6, dtype=torch.float64)
    ours = sigmoid_attention(q, k, v, attn_mask=bias, enable_gqa=True, bias=0.0)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q @ kk.transpose(-1, -2) / 2 + bias
    torch.testing.assert_close(ours, torch.sigmoid(scores) @ vv, atol=1e-12, rtol=0)


def test_sigmoid_keys_do_not_compete():
    q, k, v = _qkv(i=1)
    w = lambda kk: sigmoid_attention(
        q, kk, torch.eye(6, dtype=torch.float64)[None, None].expand(2, 2, 6, 6)
    )
    k2 = k.clone()
    k2[..., 5, :] *= 10  # one key's score changes a lot ...
    before, after = w(k), w(k2)
    torch.testing.assert_close(
        before[..., :5], after[..., :5], atol=1e-12, rtol=0
    )  # ... others don't
    soft = lambda kk: scaled_dot_product_attention(
        q, kk, torch.eye(6, dtype=torch.float64)[None, None].expand(2, 2, 6, 6)
    )
    assert not torch.allclose(soft(k)[..., :5], soft(k2)[..., :5])


def test_sigmoid_attention_refuses_bad_input():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="bias must be a float"):
        sigmoid_attention(q, k, v, bias="0")
    with pytest.raises(ValueError, match="last dimension"):
        sigmoid_attention(q, k[..., :3], v)
    with pytest.raises(ValueError):
        sigmoid_attention(
            q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.bool), is_causal=True
        )


# --------------------------------------------------------------- differential attention
def test_differential_attention_is_the_difference_of_two_softmax_attentions():
    q1, k1, v = _qkv(seed=2, e=8)
    q2, k2, _ = _qkv(seed=3, e=8)
    for causal in (False, True):
        ours = differential_attention(q1, q2, k1, k2, v, 0.3, is_causal=causal)
        expected = scaled_dot_product_attention(
            q1, k1, v, is_causal=causal
        ) - 0.3 * scaled_dot_product_attention(q2, k2, v, is_causal=causal)
        torch.testing.assert_close(ours, expected, atol=1e-12, rtol=0)
    lam = torch.tensor([0.1, 0.7], dtype=torch.float64)
    per_head = differential_attention(q1, q2, k1, k2, v, lam)
    for h in range(2):
        torch.testing.assert_close(
            per_head[:, h],
            differential_attention(
                q1[:, h : h + 1],
                q2[:, h : h + 1],
                k1[:, h : h + 1],
                k2[:, h : h + 1],
                v[:, h : h + 1],
                float(lam[h]),
            )[:, 0],
            atol=1e-12,
            rtol=0,
        )


def test_lambda_init_follows_the_paper():
    assert differential_lambda_init(1) == pytest.approx(0.2)
    for layer in range(1, 30):
        assert differential_lambda_init(layer) == pytest.approx(
            0.8 - 0.6 * math.exp(-0.3 * (layer - 1))
        )
    with pytest.raises(ValueError, match=">= 1"):
        differential_lambda_init(0)


def test_differential_module_equals_its_formula_and_is_causal():
    torch.manual_seed(0)
    layer = DifferentialAttention(16, 2, layer_index=3).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    out, weights = layer(x, is_causal=True)
    q = layer.w_query(x).view(2, 7, 2, 2, 4)
    k = layer.w_key(x).view(2, 7, 2, 2, 4)
    v = layer.w_value(x).view(2, 7, 2, 8).transpose(1, 2)
    lam = (
        math.exp(float(layer.lambda_q1.detach() @ layer.lambda_k1.detach()))
        - math.exp(float(layer.lambda_q2.detach() @ layer.lambda_k2.detach()))
        + differential_lambda_init(3)
    )
    heads = differential_attention(
        q[..., 0, :].transpose(1, 2),
        q[..., 1, :].transpose(1, 2),
        k[..., 0, :].transpose(1, 2),
        k[..., 1, :].transpose(1, 2),
        v,
        lam,
        is_causal=True,
    )
    heads = heads / torch.sqrt(heads.square().mean(-1, keepdim=True) + 1e-6)
    heads = (1 - differential_lambda_init(3)) * heads
    torch.testing.assert_close(
        out, layer.w_out(heads.transpose(1, 2).reshape(2, 7, 16)), atol=1e-12, rtol=0
    )
    assert (weights.triu(1) == 0).all()
    # an output never depends on later inputs
    x2 = x.clone()
    x2[:, -1] += 1
    torch.testing.assert_close(
        layer(x2, is_causal=True)[0][:, :-1], out[:, :-1], atol=1e-12, rtol=0
    )


def _diffllama_from(layer, layer_index):
    """Hugging Face's DiffLlamaAttention holding ``layer``'s weights, heads re-ordered.

    Our query/key rows are (head n, map p) in the order n·2 + p; DiffLlama's 2h softmax
    heads put map 1 in the first h and map 2 in the last h (head p·h + n). Our value of
    head n (2d channels) is DiffLlama's value heads n and n + h side by side.
    """
    transformers = pytest.importorskip("transformers")
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    h, d = layer.num_heads, layer.head_dim
    config = transformers.DiffLlamaConfig(
        hidden_size=2 * h * d,
        num_attention_heads=2 * h,
        num_key_value_heads=2 * h,
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
    )
    config._attn_implementation = "eager"
    hf = DiffLlamaAttention(config, layer_idx=layer_index - 1).double()
    qk_order = [(2 * n + p) for p in range(2) for n in range(h)]  # HF head -> our block
    v_order = [2 * n + half for half in range(2) for n in range(h)]
    blocks = lambda w, order: torch.cat([w.view(-1, d, w.shape[-1])[o] for o in order])
    with torch.no_grad():
        hf.q_proj.weight.copy_(blocks(layer.w_query.weight, qk_order))
        hf.k_proj.weight.copy_(blocks(layer.w_key.weight, qk_order))
        hf.v_proj.weight.copy_(blocks(layer.w_value.weight, v_order))
        hf.o_proj.weight.copy_(layer.w_out.weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(hf, name).copy_(getattr(layer, name))
    return hf


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize("num_heads, layer_index", [(1, 1), (2, 3), (3, 6)])
def test_differential_module_equals_hugging_face_diffllama_without_rope(
    num_heads, layer_index
):
    torch.manual_seed(1)
    layer = DifferentialAttention(
        8 * num_heads, num_heads, layer_index=layer_index
    ).double()
    hf = _diffllama_from(layer, layer_index)
    assert hf.lambda_init == pytest.approx(layer.lambda_init)
    b, n = 2, 6
    x = torch.randn(b, n, 8 * num_heads, dtype=torch.float64)
    no_rotation = (
        torch.ones(b, n, 4, dtype=torch.float64),
        torch.zeros(b, n, 4, dtype=torch.float64),
    )
    causal = torch.zeros(n, n, dtype=torch.float64).masked_fill(
        torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf
    )[None, None]
    ours, _ = layer(x, is_causal=True)
    theirs, _ = hf(x, position_embeddings=no_rotation, attention_mask=causal)
    # DiffLlama computes lambda's exponentials in float32, hence 1e-6 and not 1e-12
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert not torch.allclose(
        ours, hf(x, position_embeddings=no_rotation, attention_mask=None)[0], atol=1e-3
    )  # the comparison sees the mask


def test_differential_refuses_bad_input():
    q1, k1, v = _qkv()
    with pytest.raises(ValueError, match="query2 must have the shape"):
        differential_attention(q1, q1[..., :3, :], k1, k1, v, 0.5)
    with pytest.raises(TypeError, match="lam must be a float"):
        differential_attention(q1, q1, k1, k1, v, "0.5")
    with pytest.raises(ValueError, match="one value per head"):
        differential_attention(q1, q1, k1, k1, v, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of 2 \\* num_heads"):
        DifferentialAttention(10, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        DifferentialAttention(16, 2)(torch.randn(1, 4, 8))
    with pytest.raises(
        TypeError,
        match=r"x must have the dtype of the module's parameters \(torch.float32\), "
        "got torch.float64",
    ):
        DifferentialAttention(16, 2)(torch.randn(1, 4, 16, dtype=torch.float64))
    with pytest.raises(
        TypeError,
        match="query1 and query2 must share a dtype, got torch.float64 and "
        "torch.float32",
    ):
        differential_attention(q1, q1.float(), k1, k1.float(), v, 0.5)
    with pytest.raises(
        ValueError,
        match="query1 and query2 must be on the same device, got cpu and meta",
    ):
        differential_attention(q1, q1.to("meta"), k1, k1.to("meta"), v, 0.5)
    lam_meta = torch.tensor(0.5, device="meta")
    with pytest.raises(
        ValueError, match="query1 and lam must be on the same device, got cpu and meta"
    ):
        differential_attention(q1, q1, k1, k1, v, lam_meta)


def test_differential_attention_takes_a_tensor_lambda_on_inputs_without_heads():
    """(i, d) inputs have no heads axis: lam may be a 0-d tensor or have shape (1,), and
    either gives the output of the number itself, of shape (i, e)."""
    q1, k1, v = (t[0, 0] for t in _qkv())  # (i, d), (j, d), (j, e)
    q2 = q1.flip(0)
    expected = differential_attention(q1, q2, k1, k1, v, 0.3)
    for lam in (torch.tensor(0.3), torch.tensor([0.3], dtype=torch.float64)):
        torch.testing.assert_close(
            differential_attention(q1, q2, k1, k1, v, lam), expected
        )
    with pytest.raises(ValueError, match=r"shape \(1,\) for inputs without heads"):
        differential_attention(q1, q2, k1, k1, v, torch.tensor([0.3, 0.4]))


# ---------------------------------------------------------------- refinement
@pytest.mark.parametrize(
    "mechanism", ["none", "simple", "value", "additive", "stochastic"]
)
def test_refined_weights_are_causal_distributions(mechanism):
    torch.manual_seed(0)
    layer = RefinedSelfAttention(8, max_len=9, mechanism=mechanism).double()
    x = torch.randn(3, 7, 8, dtype=torch.float64)
    out, weights = layer(x)
    assert out.shape == (3, 7, 8) and weights.shape == (3, 7, 7)
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(3, 7, dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert (weights.triu(1) == 0).all() and (weights >= 0).all()
    torch.testing.assert_close(out, weights @ layer.w_value(x), atol=1e-12, rtol=0)
    x2 = x.clone()
    x2[:, -1] += 1
    torch.testing.assert_close(layer(x2)[0][:, :-1], out[:, :-1], atol=1e-12, rtol=0)


def test_refinement_none_is_plain_causal_attention():
    torch.manual_seed(1)
    layer = RefinedSelfAttention(8, max_len=6, mechanism="none").double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    expected = scaled_dot_product_attention(
        layer.w_query(x), layer.w_key(x), layer.w_value(x), is_causal=True
    )
    torch.testing.assert_close(layer(x)[0], expected, atol=1e-12, rtol=0)


def test_refinement_refuses_bad_input():
    with pytest.raises(ValueError, match="mechanism must be one of"):
        RefinedSelfAttention(8, 6, mechanism="deep")
    layer = RefinedSelfAttention(8, 6)
    with pytest.raises(ValueError, match="between 1 and max_len = 6"):
        layer(torch.randn(1, 7, 8))
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(1, 6, 4))
    with pytest.raises(
        TypeError,
        match=r"x must have the dtype of the module's parameters \(torch.float32\), "
        "got torch.float64",
    ):
        layer(torch.randn(1, 6, 8, dtype=torch.float64))
