"""Tests for attention.layers.positional: each encoding against its formula in float64
and against the implementations readers meet elsewhere (Hugging Face's Llama rotary code
and T5's buckets, Meta's complex-number RoPE written out here, the ALiBi paper's slope
rule; Llama 3.1's and YaRN's frequency scalings, Llama 4's and SmolLM3's NoPE layers),
the relative property of RoPE as a property test, and the boundary errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    MultiHeadAttention,
    RotaryConfig,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    nope_temperature,
    relative_position_bucket,
    rope_frequencies,
    sinusoidal_positions,
    temperature_tuned_attention,
)

DT = torch.float64


def _randn(*shape, seed=0, dtype=DT):
    return torch.randn(
        *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype
    )


# ---------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize(
    ("n", "d", "base"), [(7, 6, 10000.0), (20, 16, 10000.0), (5, 4, 100.0)]
)
def test_sinusoidal_positions_follow_the_formula(n, d, base):
    pe = sinusoidal_positions(n, d, base=base, dtype=DT)
    expected = torch.empty(n, d, dtype=DT)
    for p in range(n):
        for k in range(d // 2):
            angle = p / base ** (2 * k / d)
            expected[p, 2 * k], expected[p, 2 * k + 1] = (
                math.sin(angle),
                math.cos(angle),
            )
    assert_close(pe, expected, atol=1e-12, rtol=0)


def test_sinusoidal_positions_default_dtype_and_empty_shapes():
    assert sinusoidal_positions(3, 4).dtype == torch.get_default_dtype()
    assert sinusoidal_positions(0, 4).shape == (0, 4)
    assert sinusoidal_positions(3, 0).shape == (3, 0)


def test_sinusoidal_shift_is_one_rotation_for_every_position():
    # PE[p + m] = M_m PE[p] with M_m block-diagonal 2x2 rotations that do not depend on
    # p
    n, d, m = 40, 8, 5
    pe = sinusoidal_positions(n + m, d, dtype=DT)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=DT) / d)
    c, s = torch.cos(m * theta), torch.sin(m * theta)
    rot = torch.zeros(d, d, dtype=DT)
    for k in range(d // 2):  # (sin, cos) pair: sin(a+b) = sin a cos b + cos a sin b ...
        rot[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = torch.stack(
            [torch.stack([c[k], s[k]]), torch.stack([-s[k], c[k]])]
        )
    assert_close(pe[:n] @ rot.T, pe[m:], atol=1e-12, rtol=0)


# ---------------------------------------------------------------- frequencies


@pytest.mark.parametrize("d", [2, 8, 64])
def test_rope_frequencies_follow_the_formula(d):
    expected = torch.tensor([10000.0 ** (-2 * k / d) for k in range(d // 2)], dtype=DT)
    assert_close(rope_frequencies(d), expected, atol=0, rtol=1e-15)
    assert rope_frequencies(d).dtype == DT


def test_rope_frequencies_scalings_follow_their_formulas():
    d, s, base = 16, 4.0, 500.0
    k = torch.arange(d // 2, dtype=DT)
    plain = base ** (-2 * k / d)
    assert_close(
        rope_frequencies(d, base=base, scaling={"type": "linear", "factor": s}),
        plain / s,
    )
    ntk = (base * s ** (d / (d - 2))) ** (-2 * k / d)
    assert_close(
        rope_frequencies(d, base=base, scaling={"rope_type": "ntk", "factor": s}), ntk
    )
    # NTK keeps the fastest pair and divides the slowest one's frequency by exactly s
    got = rope_frequencies(d, base=base, scaling={"type": "ntk", "factor": s})
    assert got[0] == 1.0
    assert_close(got[-1], plain[-1] / s, atol=0, rtol=1e-14)


def _angle_bound(ours, theirs, max_position):
    """|angle difference| <= 2e-7 (P + 1) theta_k at every position p <= P."""
    p = torch.arange(max_position + 1, dtype=DT)[:, None]
    diff = (p * ours - p * theirs.to(DT)).abs()
    assert bool((diff <= 2e-7 * (max_position + 1) * ours).all())


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(
    ("rope_type", "factor", "seq_len", "ntk_factor"),
    [
        ("linear", 4.0, None, None),
        ("dynamic", 2.0, 64, 3.0),
        ("dynamic", 4.0, 128, 13.0),
    ],
)
def test_rope_frequencies_match_transformers_scalings(
    rope_type, factor, seq_len, ntk_factor
):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=32,
        rope_parameters={
            "rope_type": rope_type,
            "factor": factor,
            "rope_theta": 10000.0,
        },
    )
    if rope_type == "linear":
        theirs, _ = ROPE_INIT_FUNCTIONS["linear"](config, None)
        ours = rope_frequencies(16, scaling={"type": "linear", "factor": factor})
    else:
        # dynamic NTK at seq_len L: a static NTK factor, factor * L / 32 - (factor - 1)
        theirs, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=seq_len)
        assert factor * seq_len / 32 - (factor - 1) == ntk_factor
        ours = rope_frequencies(16, scaling={"type": "ntk", "factor": ntk_factor})
    _angle_bound(ours, theirs, max_position=4 * 32)


# ---------------------------------------------------------------- apply_rope


def _rope_by_matrices(x, positions, base=10000.0, interleaved=False):
    """Multiply every row by its block rotation matrix, built entry by entry."""
    *lead, n, d = x.shape
    out = torch.empty_like(x)
    for r in range(n):
        rot = torch.zeros(d, d, dtype=DT)
        for k in range(d // 2):
            a, b = (2 * k, 2 * k + 1) if interleaved else (k, k + d // 2)
            angle = int(positions[r]) * base ** (-2 * k / d)
            rot[a, a], rot[a, b] = math.cos(angle), -math.sin(angle)
            rot[b, a], rot[b, b] = math.sin(angle), math.cos(angle)
        out[..., r, :] = x[..., r, :] @ rot.T
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_is_a_rotation_of_each_pair(interleaved):
    x = _randn(2, 3, 6, 8)
    positions = torch.tensor([0, 1, 5, 17, 100, 3])
    got = apply_rope(x, positions, interleaved=interleaved)
    assert_close(
        got,
        _rope_by_matrices(x, positions, interleaved=interleaved),
        atol=1e-12,
        rtol=0,
    )
    assert_close(
        got.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0
    )  # rotations keep norms


@pytest.mark.slow  # imports transformers: make test, not make check
def test_apply_rope_matches_hugging_face_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    q, k = _randn(2, 4, 9, 16, seed=1), _randn(2, 2, 9, 16, seed=2)
    position_ids = torch.tensor([list(range(9)), list(range(20, 29))])  # (b, n)

    # the rotary class (cos/sin computed in float32 there): tolerance of float32 angles
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q = apply_rope(q, position_ids[:, None, :])  # (b, 1, n) broadcasts over heads
    assert_close(ours_q, q_hf, atol=1e-5, rtol=0)
    assert_close(apply_rope(k, position_ids[:, None, :]), k_hf, atol=1e-5, rtol=0)

    # the same function fed float64 angles: the layouts agree to rounding
    angles = position_ids[..., None].to(DT) * rope_frequencies(16)  # (b, n, d/2)
    emb = torch.cat((angles, angles), dim=-1)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    assert_close(ours_q, q_hf, atol=1e-14, rtol=0)


def _meta_rope(x, positions, base=10000.0):
    """Meta's llama form: pairs (2k, 2k+1) as complex numbers times exp(i p theta_k)."""
    d = x.shape[-1]
    theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=DT)[: d // 2] / d)
    freqs_cis = torch.polar(
        torch.ones(len(positions), d // 2, dtype=DT),
        torch.outer(positions.to(DT), theta),
    )
    x_c = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(x_c * freqs_cis).flatten(-2)


def test_apply_rope_interleaved_matches_metas_complex_form():
    x = _randn(3, 2, 11, 12, seed=3)
    positions = torch.arange(40, 51)
    assert_close(
        apply_rope(x, positions, interleaved=True),
        _meta_rope(x, positions),
        atol=1e-12,
        rtol=0,
    )


def test_the_two_layouts_differ_by_a_fixed_feature_permutation():
    d = 10
    x = _randn(4, 7, d, seed=4)
    perm = torch.cat(
        [torch.arange(0, d, 2), torch.arange(1, d, 2)]
    )  # (2k, 2k+1) -> (k, k+d/2)
    inverse = torch.argsort(perm)
    half = apply_rope(x[..., perm], interleaved=False)[..., inverse]
    assert torch.equal(
        half, apply_rope(x, interleaved=True)
    )  # the same products, exactly


@given(
    offset=st.integers(-100_000, 100_000),
    n=st.integers(1, 6),
    half_d=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    interleaved=st.booleans(),
)
def test_rope_scores_depend_only_on_the_distance(offset, n, half_d, seed, interleaved):
    q, k = _randn(n, 2 * half_d, seed=seed), _randn(n, 2 * half_d, seed=seed + 1)
    positions = torch.randint(
        0, 50, (n,), generator=torch.Generator().manual_seed(seed)
    )

    def scores(p):
        return (
            apply_rope(q, p, interleaved=interleaved)
            @ apply_rope(k, p, interleaved=interleaved).T
        )

    # float64 angles of size |offset| carry an error of about |offset| * 1e-16
    assert_close(scores(positions + offset), scores(positions), atol=1e-9, rtol=0)


def test_apply_rope_default_positions_broadcasting_and_dtype():
    x = _randn(2, 3, 5, 4)
    assert torch.equal(apply_rope(x), apply_rope(x, torch.arange(5)))
    per_batch = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])[
        :, None, :
    ]  # (b, 1, n)
    got = apply_rope(x, per_batch)
    assert torch.equal(got[1], apply_rope(x[1], torch.arange(7, 12)))
    assert torch.equal(
        apply_rope(x, torch.tensor([3])), apply_rope(x, torch.full((5,), 3))
    )
    for dtype in (torch.float32, torch.bfloat16):
        y = apply_rope(x.to(dtype))
        assert y.dtype == dtype and y.shape == x.shape


def test_linear_scaling_divides_the_positions():
    x = _randn(6, 8, seed=5)
    scaled = apply_rope(
        x, torch.arange(0, 24, 4), scaling={"type": "linear", "factor": 4.0}
    )
    assert_close(scaled, apply_rope(x, torch.arange(6)), atol=1e-14, rtol=0)


# ---------------------------------------------------------------- ALiBi


def _paper_slopes(h):
    """The ALiBi paper's rule: 2^(-8k/h) for a power of two; otherwise the slopes of the
    closest smaller power of two, then every other slope of the next power of two."""
    if math.log2(h).is_integer():
        return [2 ** (-8 * k / h) for k in range(1, h + 1)]
    below = 2 ** math.floor(math.log2(h))
    return _paper_slopes(below) + _paper_slopes(2 * below)[::2][: h - below]


@pytest.mark.parametrize("h", [1, 2, 4, 8, 12, 16, 24])
def test_alibi_slopes_are_the_papers(h):
    got = alibi_slopes(h)
    assert got.shape == (h,) and got.dtype == DT
    assert_close(got, torch.tensor(_paper_slopes(h), dtype=DT), atol=0, rtol=1e-15)


def test_alibi_slopes_known_values():
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    twelve = alibi_slopes(12)
    assert twelve[:8].tolist() == [2.0**-k for k in range(1, 9)]
    assert_close(
        twelve[8:], torch.tensor([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5], dtype=DT)
    )


@pytest.mark.parametrize(("i", "j"), [(5, 5), (2, 6), (1, 4), (0, 3)])
def test_alibi_bias_formula_and_use_as_float_mask(i, j):
    h = 3
    bias = alibi_bias(h, i, j, dtype=DT)
    slopes = _paper_slopes(h)
    expected = torch.tensor(
        [
            [[-slopes[n] * abs((q + j - i) - k) for k in range(j)] for q in range(i)]
            for n in range(h)
        ],
        dtype=DT,
    ).reshape(h, i, j)
    assert_close(bias, expected, atol=1e-15, rtol=0)
    # as a float attn_mask of torch's SDPA: the softmax of the biased scores
    q, k, v = (
        _randn(2, h, i, 4, seed=6),
        _randn(2, h, j, 4, seed=7),
        _randn(2, h, j, 3, seed=8),
    )
    manual = torch.softmax(q @ k.transpose(-2, -1) / 2.0 + bias, dim=-1) @ v
    assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        manual,
        atol=1e-12,
        rtol=0,
    )


def test_alibi_bias_default_dtype():
    assert alibi_bias(2, 3, 3).dtype == torch.get_default_dtype()


# ---------------------------------------------------------------- T5 buckets


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(
    ("bidirectional", "num_buckets", "max_distance"),
    [
        (True, 32, 128),
        (False, 32, 128),
        (True, 8, 20),
        (False, 16, 64),
        (True, 33, 100),
    ],
)
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-600, 601)
    ours = relative_position_bucket(
        rel,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    theirs = T5Attention._relative_position_bucket(
        rel, bidirectional, num_buckets, max_distance
    )
    assert ours.dtype == torch.int64
    assert torch.equal(ours, theirs.to(torch.int64))
    assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


def test_relative_position_bucket_of_a_query_key_grid():
    q, k = torch.arange(5)[:, None], torch.arange(5)[None, :]
    buckets = relative_position_bucket(k - q, bidirectional=False)
    assert buckets.shape == (5, 5)
    assert torch.equal(
        buckets.diagonal(-1), torch.ones(4, dtype=torch.int64)
    )  # one key back
    assert bool((buckets.triu(1) == 0).all())  # future keys: bucket 0 in a decoder


# ---------------------------------------------------------------- bad input


def test_odd_feature_sizes_are_refused():
    with pytest.raises(ValueError, match="d must be even .* got 5"):
        sinusoidal_positions(4, 5)
    with pytest.raises(ValueError, match="d must be even .* got 7"):
        rope_frequencies(7)
    with pytest.raises(ValueError, match="last dimension d of x must be even .* got 3"):
        apply_rope(torch.randn(4, 3))


def test_non_integer_positions_are_refused():
    with pytest.raises(
        TypeError, match="positions must be an integer tensor .* torch.float32"
    ):
        apply_rope(torch.randn(3, 4), torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        relative_position_bucket(torch.tensor([0.5]))
    with pytest.raises(TypeError, match="positions must be a torch.Tensor"):
        apply_rope(torch.randn(3, 4), [0, 1, 2])


def test_positions_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"must broadcast .* got \(4,\) and \(3,\)"):
        apply_rope(torch.randn(3, 4), torch.arange(4))


def test_unknown_or_malformed_scaling_is_refused():
    with pytest.raises(ValueError, match="scaling type must be one of .*'yarn'"):
        rope_frequencies(8, scaling={"type": "longrope", "factor": 2.0})
    with pytest.raises(TypeError, match="scaling must be a dict or None, got float"):
        apply_rope(torch.randn(3, 4), scaling=2.0)
    with pytest.raises(ValueError, match="needs a 'factor'"):
        rope_frequencies(8, scaling={"type": "linear"})
    with pytest.raises(ValueError, match=r"factor'\] must be finite and > 0, got -2"):
        rope_frequencies(8, scaling={"type": "linear", "factor": -2.0})
    with pytest.raises(ValueError, match="accepts the keys"):
        rope_frequencies(8, scaling={"type": "linear", "factor": 2.0, "beta": 1})
    with pytest.raises(ValueError, match="disagree"):
        rope_frequencies(
            8, scaling={"type": "linear", "rope_type": "ntk", "factor": 2.0}
        )
    with pytest.raises(ValueError, match="NTK scaling needs d >= 4"):
        rope_frequencies(2, scaling={"type": "ntk", "factor": 2.0})


def test_negative_sizes_and_bools_as_ints_are_refused():
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        sinusoidal_positions(-1, 4)
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        sinusoidal_positions(True, 4)
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads must be an int, got bool"):
        alibi_bias(True, 2, 2)
    with pytest.raises(ValueError, match="i <= j is needed, got i=3 and j=2"):
        alibi_bias(2, 3, 2)


def test_bad_flags_bases_and_dtypes_are_refused():
    with pytest.raises(TypeError, match="interleaved must be a bool .*got str"):
        apply_rope(torch.randn(3, 4), interleaved="yes")
    with pytest.raises(TypeError, match="bidirectional must be a bool .*got int"):
        relative_position_bucket(torch.tensor([1]), bidirectional=1)
    with pytest.raises(ValueError, match="base must be finite and > 0, got 0"):
        rope_frequencies(8, base=0.0)
    with pytest.raises(TypeError, match="base must be a float, got bool"):
        sinusoidal_positions(3, 4, base=True)
    with pytest.raises(
        TypeError, match="dtype must be a floating-point dtype, got torch.int64"
    ):
        sinusoidal_positions(3, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        apply_rope(torch.arange(8).reshape(2, 4))


def test_unusable_bucket_settings_are_refused():
    with pytest.raises(ValueError, match="at least 2 buckets per direction"):
        relative_position_bucket(torch.tensor([1]), num_buckets=2)
    with pytest.raises(
        ValueError, match="max_distance must exceed the 8 exact buckets"
    ):
        relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=8)


# --------------------------------------------------------- MultiHeadAttention(rope=...)


def _llama_and_ours(num_heads=4, num_kv_heads=2, head_dim=8, seed=0):
    """A Hugging Face LlamaAttention (tiny config, random weights) and our module with
    its weights."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaRotaryEmbedding,
    )

    config = LlamaConfig(
        hidden_size=num_heads * head_dim,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        attn_implementation="sdpa",  # the eager path takes its softmax in float32
    )
    torch.manual_seed(seed)
    llama = LlamaAttention(config, layer_idx=0).to(DT).eval()
    ours = MultiHeadAttention(
        num_heads * head_dim,
        num_heads,
        num_kv_heads=num_kv_heads,
        bias=False,
        rope=RotaryConfig(base=500.0),
        dtype=DT,
    ).eval()
    with torch.no_grad():
        for mine, theirs in (
            ("w_query", "q_proj"),
            ("w_key", "k_proj"),
            ("w_value", "v_proj"),
            ("w_out", "o_proj"),
        ):
            getattr(ours, mine).weight.copy_(getattr(llama, theirs).weight)
    return llama, LlamaRotaryEmbedding(config), ours


def _llama_forward(llama, x, position_ids, cos_sin):
    n = x.shape[1]
    causal = torch.zeros(n, n, dtype=DT).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf
    )
    with torch.no_grad():
        out, _ = llama(
            x, position_embeddings=cos_sin, attention_mask=causal[None, None]
        )
    return out


def _float64_cos_sin(position_ids, head_dim, base):
    angles = position_ids[..., None].to(DT) * rope_frequencies(
        head_dim, base=base
    )  # (b, n, d/2)
    emb = torch.cat(
        (angles, angles), dim=-1
    )  # Hugging Face's layout: the halves repeated
    return emb.cos(), emb.sin()


@pytest.mark.slow  # imports transformers: make test, not make check
def test_rope_multihead_attention_equals_hugging_face_llama_attention():
    llama, rotary, ours = _llama_and_ours()
    x = _randn(2, 9, 32, seed=11)
    position_ids = torch.arange(9)[None].expand(2, 9)
    with torch.no_grad():
        out, _ = ours(x, x, x, is_causal=True)
    # Hugging Face's rotary class computes the angles in float32: float32-sized
    # differences
    assert_close(
        out,
        _llama_forward(llama, x, position_ids, rotary(x, position_ids)),
        atol=1e-5,
        rtol=0,
    )
    # fed float64 angles, the two agree to rounding: same layout, same GQA grouping
    exact = _llama_forward(
        llama, x, position_ids, _float64_cos_sin(position_ids, 8, 500.0)
    )
    assert_close(out, exact, atol=1e-12, rtol=0)
    with torch.no_grad():  # the materialising path gives the same
        assert_close(
            ours(x, x, x, is_causal=True, need_weights=True)[0],
            exact,
            atol=1e-12,
            rtol=0,
        )


@pytest.mark.slow  # imports transformers: make test, not make check
def test_rope_multihead_cached_decoding_equals_the_full_llama_forward():
    llama, _, ours = _llama_and_ours(num_heads=4, num_kv_heads=1)
    x = _randn(2, 10, 32, seed=12)
    position_ids = torch.arange(10)[None].expand(2, 10)
    expected = _llama_forward(
        llama, x, position_ids, _float64_cos_sin(position_ids, 8, 500.0)
    )
    cache = ours.new_cache(batch_size=2, max_len=10)
    with torch.inference_mode():
        pieces = [
            ours(x[:, :6], x[:, :6], x[:, :6], is_causal=True, cache=cache)[0]
        ]  # prefill
        for t in range(
            6, 10
        ):  # then one token at a time: positions continue from the cache
            step = x[:, t : t + 1]
            pieces.append(ours(step, step, step, is_causal=True, cache=cache)[0])
    assert_close(torch.cat(pieces, dim=1), expected, atol=1e-12, rtol=0)


@pytest.mark.slow  # imports transformers: make test, not make check
def test_rope_multihead_positions_argument():
    _, _, ours = _llama_and_ours()
    x = _randn(2, 7, 32, seed=13)
    with torch.no_grad():
        default, _ = ours(x, x, x, is_causal=True)
        explicit, _ = ours(x, x, x, is_causal=True, positions=torch.arange(7))
        shifted, _ = ours(x, x, x, is_causal=True, positions=torch.arange(500, 507))
        per_row, _ = ours(
            x,
            x,
            x,
            is_causal=True,
            positions=torch.stack([torch.arange(7), torch.arange(40, 47)]),
        )
    assert torch.equal(explicit, default)
    assert_close(
        shifted, default, atol=1e-10, rtol=0
    )  # scores depend on distances only
    assert_close(per_row, default, atol=1e-10, rtol=0)
    interleaved = MultiHeadAttention(
        32,
        4,
        num_kv_heads=2,
        bias=False,
        rope=RotaryConfig(base=500.0, interleaved=True),
        dtype=DT,
    )
    interleaved.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert not torch.allclose(
            interleaved(x, x, x, is_causal=True)[0], default
        )  # another layout


def test_rope_multihead_attention_refuses_bad_input():
    mha = MultiHeadAttention(16, 2, rope=RotaryConfig())
    x, memory = torch.randn(1, 4, 16), torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match="same length, got 6 and 4"):
        mha(x, memory, memory)  # cross-attention
    with pytest.raises(
        ValueError, match=r"build the module with rope=RotaryConfig\(\)"
    ):
        MultiHeadAttention(16, 2)(x, x, x, positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        mha(x, x, x, positions=torch.arange(4.0))
    with pytest.raises(ValueError, match="must broadcast"):
        mha(x, x, x, positions=torch.arange(5))
    with pytest.raises(ValueError, match="head_dim must be even, got 3"):
        MultiHeadAttention(6, 2, rope=RotaryConfig())
    with pytest.raises(TypeError, match="rope must be a RotaryConfig or None, got int"):
        MultiHeadAttention(16, 2, rope=1)
    with pytest.raises(
        TypeError, match="rope must be a RotaryConfig or None, got bool"
    ):
        MultiHeadAttention(16, 2, rope=True)
    with pytest.raises(ValueError, match="base must be finite and > 0"):
        MultiHeadAttention(16, 2, rope=RotaryConfig(base=-1.0))
    with pytest.raises(ValueError, match="NTK scaling needs d >= 4"):
        MultiHeadAttention(
            4, 2, rope=RotaryConfig(scaling={"type": "ntk", "factor": 2.0})
        )


def test_rotary_config_is_validated_frozen_and_rotates_as_apply_rope():
    x = _randn(2, 3, 6, 8, seed=4)
    positions = torch.arange(2, 8)
    rope = RotaryConfig(
        base=50.0, interleaved=True, scaling={"type": "linear", "factor": 2.0}
    )
    expected = apply_rope(
        x,
        positions,
        base=50.0,
        interleaved=True,
        scaling={"type": "linear", "factor": 2.0},
    )
    assert torch.equal(rope.rotate(x, positions), expected)
    with pytest.raises(AttributeError):
        rope.base = 1.0
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        RotaryConfig(interleaved=1)
    with pytest.raises(TypeError, match="scaling must be a dict or None"):
        RotaryConfig(scaling=2.0)
    with pytest.raises(ValueError, match="scaling type must be one of"):
        RotaryConfig(scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="base must be finite and > 0, got nan"):
        RotaryConfig(base=math.nan)


def test_rotary_config_with_scaling_is_hashable_and_keeps_its_own_copy():
    """A frozen dataclass is hashed from its fields, so the scaling dict is stored as a
    read-only, hashable copy that reads and compares like the dict it was given."""
    given = {"type": "linear", "factor": 2.0}
    rope = RotaryConfig(scaling=given)
    same = RotaryConfig(scaling={"factor": 2, "type": "linear"})
    assert rope == same and hash(rope) == hash(same) and len({rope, same}) == 1
    assert hash(rope) != hash(RotaryConfig(scaling={"type": "ntk", "factor": 2.0}))
    given["factor"] = 8.0  # the caller's dict changes, the config does not
    assert rope.scaling == {"type": "linear", "factor": 2.0}
    assert rope.scaling["factor"] == 2.0 and dict(rope.scaling) == rope.scaling
    with pytest.raises(TypeError):
        rope.scaling["factor"] = 4.0
    assert "scaling={'type': 'linear', 'factor': 2.0}" in repr(rope)
    x = _randn(2, 5, 8, seed=5)
    assert torch.equal(
        rope.rotate(x), apply_rope(x, scaling={"type": "linear", "factor": 2.0})
    )


# ---------------------------------------------------------------- Llama 3.1, YaRN, NoPE
# transformers computes its RoPE frequencies in `torch.float` (float32). With that alias
# pointed at float64 for the call, the same code runs in double precision, and ours must
# equal it to 1e-10; unpatched, to float32's precision.


def _hf_inv_freq(config, rope_type, monkeypatch, float64):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    with monkeypatch.context() as patch:
        if float64:
            patch.setattr(torch, "float", torch.float64)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    assert inv_freq.dtype == (DT if float64 else torch.float32)
    return inv_freq, attention_factor


def _llama_config(head_dim, base, rope_parameters, **kw):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=False,
        rope_parameters={**rope_parameters, "rope_theta": base},
        **kw,
    )


LLAMA3_CASES = [
    # Llama 3.1's own: head size 128, base 500000, factor 8, bands 1 and 4, 8192 trained
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),
    # the chapter's tiny model: 8 pairs, 32 trained positions
    (16, 10000.0, 8.0, 1.0, 4.0, 32),
    (64, 10000.0, 3.0, 2.0, 16.0, 256),
]


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(
    ("d", "base", "factor", "low", "high", "original"), LLAMA3_CASES
)
def test_llama3_frequencies_equal_transformers(
    d, base, factor, low, high, original, monkeypatch
):
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    config = _llama_config(d, base, scaling, max_position_embeddings=8 * original)
    ours = rope_frequencies(d, base=base, scaling=scaling)
    theirs64, factor64 = _hf_inv_freq(config, "llama3", monkeypatch, float64=True)
    assert_close(ours, theirs64, atol=0, rtol=1e-12)
    theirs32, _ = _hf_inv_freq(config, "llama3", monkeypatch, float64=False)
    assert_close(ours, theirs32.to(DT), atol=0, rtol=1e-6)
    assert factor64 == 1.0 == RotaryConfig(base=base, scaling=scaling).attention_factor
    # three bands: fast pairs kept, slow pairs divided by the factor, a blend between
    turns = original * rope_frequencies(d, base=base) / (2 * math.pi)
    ratio = rope_frequencies(d, base=base) / ours
    assert bool((ratio[turns >= high] == 1).all())
    assert_close(ratio[turns <= low], torch.full_like(ratio[turns <= low], factor))
    between = ratio[(turns > low) & (turns < high)]
    assert bool(((between > 1) & (between < factor)).all())


# yarn cases whose ramp spans 1, 2 or 4 pairs: transformers builds the ramp in float32,
# exact for such widths, so the float64 run is exact too
YARN_CASES = [
    (16, 10000.0, 8.0, 32, {}),  # ramp over pairs 0..2
    (16, 10000.0, 4.0, 4096, {}),  # ramp over pairs 2..6
    (64, 500000.0, 16.0, 32, {"beta_fast": 32.0, "beta_slow": 1.0}),  # pairs 0..4
    (16, 10000.0, 8.0, 32, {"attention_factor": 1.5}),  # a given attention factor
    (16, 500000.0, 2.0, 64, {"beta_fast": 16.0, "beta_slow": 2.0}),
]


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(("d", "base", "factor", "original", "extra"), YARN_CASES)
def test_yarn_frequencies_and_attention_factor_equal_transformers(
    d, base, factor, original, extra, monkeypatch
):
    scaling = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        **extra,
    }
    config = _llama_config(d, base, scaling, max_position_embeddings=8 * original)
    ours = rope_frequencies(d, base=base, scaling=scaling)
    theirs64, theirs_factor = _hf_inv_freq(config, "yarn", monkeypatch, float64=True)
    assert_close(ours, theirs64, atol=0, rtol=1e-12)
    theirs32, _ = _hf_inv_freq(config, "yarn", monkeypatch, float64=False)
    assert_close(ours, theirs32.to(DT), atol=0, rtol=1e-6)
    expected_factor = extra.get("attention_factor", 0.1 * math.log(factor) + 1)
    rope = RotaryConfig(base=base, scaling=scaling)
    assert rope.attention_factor == pytest.approx(theirs_factor, rel=1e-15, abs=0)
    assert rope.attention_factor == pytest.approx(expected_factor, rel=1e-15, abs=0)


@pytest.mark.slow  # imports transformers: make test, not make check
def test_yarn_without_truncation_equals_transformers_to_float32_precision(monkeypatch):
    # a fractional ramp: transformers' float32 ramp bounds what can be compared
    scaling = {
        "type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "truncate": False,
    }
    config = _llama_config(32, 10000.0, {**scaling, "rope_type": "yarn"})
    config.rope_parameters.pop("type")
    theirs, _ = _hf_inv_freq(config, "yarn", monkeypatch, float64=False)
    ours = rope_frequencies(32, scaling=scaling)
    assert_close(ours, theirs.to(DT), atol=0, rtol=1e-6)
    truncated = rope_frequencies(32, scaling={**scaling, "truncate": True})
    assert not torch.allclose(ours, truncated)  # the option does something


def test_yarn_rotation_is_the_rotation_times_the_attention_factor():
    x = _randn(2, 3, 7, 16, seed=21)
    scaling = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}
    rope = RotaryConfig(scaling=scaling)
    rotated = apply_rope(x, scaling=scaling)
    assert torch.equal(rope.rotate(x), rotated)
    norms = rotated.norm(dim=-1) / x.norm(dim=-1)
    assert_close(
        norms, torch.full_like(norms, rope.attention_factor), atol=1e-13, rtol=0
    )
    # so a score q . k is multiplied by the factor squared, and still relative
    q, k = _randn(5, 16, seed=22), _randn(5, 16, seed=23)
    positions = torch.arange(5)

    def scores(p, scaling):
        return apply_rope(q, p, scaling=scaling) @ apply_rope(k, p, scaling=scaling).T

    no_factor = {**scaling, "attention_factor": 1.0}
    assert_close(
        scores(positions, scaling),
        rope.attention_factor**2 * scores(positions, no_factor),
        atol=1e-12,
        rtol=0,
    )
    assert_close(
        scores(positions + 300, scaling), scores(positions, scaling), atol=1e-10, rtol=0
    )
    # the frequencies do not depend on the attention factor
    assert torch.equal(
        rope_frequencies(16, scaling=scaling), rope_frequencies(16, scaling=no_factor)
    )


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(
    "scaling",
    [
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 32,
        },
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ],
    ids=["yarn", "llama3"],
)
def test_scaled_rope_multihead_attention_equals_llama_attention(scaling, monkeypatch):
    """MultiHeadAttention(rope=RotaryConfig(scaling=...)) against LlamaAttention fed the
    cos/sin its rotary class computes: in float64 (the float alias patched, as in
    LlamaRotaryEmbedding: the angles of both halves, times attention_scaling) to 1e-10,
    and from the class itself (float32 angles) to float32's precision."""
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaRotaryEmbedding,
    )

    base, n = 500.0, 40  # past 32: the scaled frequencies matter
    config = _llama_config(
        8, base, scaling, max_position_embeddings=256, attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).to(DT).eval()
    ours = MultiHeadAttention(
        32,
        4,
        num_kv_heads=2,
        bias=False,
        rope=RotaryConfig(base=base, scaling=scaling),
        dtype=DT,
    ).eval()
    with torch.no_grad():
        for mine, theirs in (
            ("w_query", "q_proj"),
            ("w_key", "k_proj"),
            ("w_value", "v_proj"),
            ("w_out", "o_proj"),
        ):
            getattr(ours, mine).weight.copy_(getattr(llama, theirs).weight)
    x = _randn(2, n, 32, seed=24)
    position_ids = torch.arange(n)[None].expand(2, n)
    with torch.no_grad():
        out, _ = ours(x, x, x, is_causal=True)

    inv_freq, attention_scaling = _hf_inv_freq(
        config, scaling["rope_type"], monkeypatch, float64=True
    )
    angles = position_ids[..., None].to(DT) * inv_freq  # (b, n, d/2)
    emb = torch.cat((angles, angles), dim=-1)
    cos_sin = (emb.cos() * attention_scaling, emb.sin() * attention_scaling)
    assert_close(
        out, _llama_forward(llama, x, position_ids, cos_sin), atol=1e-10, rtol=0
    )

    rotary = LlamaRotaryEmbedding(config)
    assert rotary.attention_scaling == ours.rope.attention_factor
    theirs = _llama_forward(llama, x, position_ids, rotary(x, position_ids))
    assert_close(out, theirs, atol=1e-5, rtol=0)


def _llama4_text_config(**kw):
    from transformers import Llama4TextConfig

    return Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=4,
        intermediate_size=64,
        intermediate_size_mlp=64,
        vocab_size=50,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",  # Llama 4's eager softmax keeps the input dtype
        **kw,
    )


def _copy_projections(ours, theirs):
    with torch.no_grad():
        for mine, name in (
            ("w_query", "q_proj"),
            ("w_key", "k_proj"),
            ("w_value", "v_proj"),
            ("w_out", "o_proj"),
        ):
            getattr(ours, mine).weight.copy_(getattr(theirs, name).weight)


def _causal_float_mask(n):
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.zeros(n, n, dtype=DT).masked_fill(~visible, -math.inf)[None, None]


@pytest.mark.slow  # imports transformers: make test, not make check
def test_nope_temperature_follows_the_formula_and_llama4_defaults():
    config = _llama4_text_config()
    assert (config.floor_scale, config.attn_scale) == (8192, 0.1)
    # every fourth layer is a NoPE layer (0 in no_rope_layers), as in Llama 4
    assert config.no_rope_layers == [1, 1, 1, 0]
    positions = torch.tensor([0, 1, 8190, 8191, 16382, 16383, 10**6, 10**9])
    expected = torch.tensor(
        [1 + 0.1 * math.log1p(math.floor((p + 1) / 8192)) for p in positions.tolist()],
        dtype=DT,
    )
    got = nope_temperature(positions)
    assert got.dtype == DT
    assert_close(got, expected, atol=1e-15, rtol=0)
    assert got[:3].tolist() == [1.0, 1.0, 1.0]  # below floor_scale: no change
    grid = torch.arange(12).reshape(3, 4)
    assert_close(
        nope_temperature(grid, floor_scale=3, attn_scale=0.5),
        1 + 0.5 * torch.log1p(((grid + 1) // 3).to(DT)),
        atol=1e-15,
        rtol=0,
    )


def _llama4_nope_layer_and_ours(floor_scale, attn_scale, seed=0):
    import functools

    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    config = _llama4_text_config(
        floor_scale=floor_scale, attn_scale=attn_scale, use_qk_norm=False
    )
    torch.manual_seed(seed)
    layer = Llama4TextAttention(config, layer_idx=3).to(DT).eval()
    assert not layer.use_rope and layer.attn_temperature_tuning
    kernel = functools.partial(
        temperature_tuned_attention, floor_scale=floor_scale, attn_scale=attn_scale
    )
    ours = MultiHeadAttention(
        32, 4, num_kv_heads=2, bias=False, attention_fn=kernel, dtype=DT
    ).eval()
    _copy_projections(ours, layer)
    return layer, ours


@pytest.mark.slow  # imports transformers: make test, not make check
@pytest.mark.parametrize(
    ("floor_scale", "attn_scale"), [(4, 0.1), (3, 0.7), (8192, 0.1)]
)
def test_temperature_tuned_attention_equals_a_llama4_nope_layer(
    floor_scale, attn_scale, monkeypatch
):
    """A NoPE layer of Llama 4 (Llama4TextAttention at layer 3 of 4: no rotation, the
    queries times the temperature) against MultiHeadAttention with no rope and
    temperature_tuned_attention as its kernel. transformers computes the factors with a
    float32 log1p: with log1p taken in float64 the two agree to 1e-10, as they are."""
    layer, ours = _llama4_nope_layer_and_ours(floor_scale, attn_scale)
    n = 23
    x = _randn(2, n, 32, seed=31)
    with torch.no_grad():
        out, _ = ours(x, x, x, is_causal=True)
        log1p = torch.log1p
        with monkeypatch.context() as patch:
            patch.setattr(torch, "log1p", lambda t: log1p(t.to(DT)))
            theirs64, _ = layer(x, None, _causal_float_mask(n))
        theirs32, _ = layer(x, None, _causal_float_mask(n))
    assert_close(out, theirs64, atol=1e-10, rtol=0)
    assert_close(out, theirs32, atol=1e-6, rtol=0)
    # the temperature matters: without it the outputs differ (past floor_scale)
    if floor_scale < n:
        plain = MultiHeadAttention(32, 4, num_kv_heads=2, bias=False, dtype=DT).eval()
        plain.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert not torch.allclose(plain(x, x, x, is_causal=True)[0], out)


@pytest.mark.slow  # imports transformers: make test, not make check
def test_temperature_tuned_attention_decodes_with_a_cache():
    _, ours = _llama4_nope_layer_and_ours(4, 0.3)
    x = _randn(1, 11, 32, seed=32)
    with torch.inference_mode():
        full, _ = ours(x, x, x, is_causal=True)
        cache = ours.new_cache(batch_size=1, max_len=11)
        pieces = [ours(x[:, :5], x[:, :5], x[:, :5], is_causal=True, cache=cache)[0]]
        for t in range(5, 11):  # the query at position t gets the factor of t
            step = x[:, t : t + 1]
            pieces.append(ours(step, step, step, is_causal=True, cache=cache)[0])
    assert_close(torch.cat(pieces, dim=1), full, atol=1e-12, rtol=0)


def test_temperature_tuned_attention_is_sdpa_of_the_scaled_queries():
    q, k, v = (
        _randn(2, 4, 3, 6, seed=33),
        _randn(2, 2, 9, 6, seed=34),
        _randn(2, 2, 9, 5),
    )
    tau = nope_temperature(torch.arange(6, 9), floor_scale=2, attn_scale=0.4)  # last 3
    mask = torch.rand(3, 9, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[:, -1] = True
    got = temperature_tuned_attention(
        q, k, v, attn_mask=mask, enable_gqa=True, floor_scale=2, attn_scale=0.4
    )
    expected = F.scaled_dot_product_attention(
        q * tau[:, None], k, v, attn_mask=mask, enable_gqa=True
    )
    assert_close(got, expected, atol=1e-12, rtol=0)
    # attn_scale = 0: plain attention
    plain = temperature_tuned_attention(
        q, k, v, is_causal=True, enable_gqa=True, attn_scale=0.0
    )
    assert_close(
        plain,
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        atol=1e-12,
        rtol=0,
    )
    half = temperature_tuned_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert half.dtype == torch.float32


@pytest.mark.slow  # imports transformers: make test, not make check
def test_smollm3_nope_and_rope_layers_equal_multihead_attention():
    """SmolLM3 drops RoPE in every fourth layer (no temperature): its NoPE layer is
    MultiHeadAttention without rope, its RoPE layers use rope=RotaryConfig(base=...)."""
    from transformers import SmolLM3Config
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Attention

    config = SmolLM3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=8,
        intermediate_size=64,
        vocab_size=50,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",  # the eager path takes its softmax in float32
    )
    assert config.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]
    base = config.rope_parameters["rope_theta"]
    assert base == 2_000_000.0
    n = 13
    x = _randn(2, n, 32, seed=35)
    position_ids = torch.arange(n)[None].expand(2, n)
    cos_sin = _float64_cos_sin(position_ids, 8, base)
    for layer_idx, rope in ((3, None), (0, RotaryConfig(base=base))):
        torch.manual_seed(layer_idx)
        layer = SmolLM3Attention(config, layer_idx=layer_idx).to(DT).eval()
        assert bool(layer.use_rope) == (rope is not None)
        ours = MultiHeadAttention(
            32, 4, num_kv_heads=2, bias=False, rope=rope, dtype=DT
        ).eval()
        _copy_projections(ours, layer)
        with torch.no_grad():
            theirs, _ = layer(x, cos_sin, _causal_float_mask(n))
            out, _ = ours(x, x, x, is_causal=True)
        assert_close(out, theirs, atol=1e-10, rtol=0)


@pytest.mark.slow  # imports transformers: make test, not make check
def test_llama4_rope_layer_with_llama3_scaling_equals_interleaved_rope():
    """A RoPE layer of Llama 4 (Meta's complex-number form: interleaved pairs, its
    llama3 frequency scaling). Llama 4 rotates in float32 whatever the input dtype, so
    float32's precision is what can be compared."""
    from transformers.models.llama4.modeling_llama4 import (
        Llama4TextAttention,
        Llama4TextRotaryEmbedding,
    )

    scaling = {
        "rope_type": "llama3",
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    config = _llama4_text_config(
        use_qk_norm=False,
        rope_parameters={**scaling, "rope_theta": 500000.0},
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    layer = Llama4TextAttention(config, layer_idx=0).to(DT).eval()
    assert layer.use_rope
    ours = MultiHeadAttention(
        32,
        4,
        num_kv_heads=2,
        bias=False,
        rope=RotaryConfig(base=500000.0, interleaved=True, scaling=scaling),
        dtype=DT,
    ).eval()
    _copy_projections(ours, layer)
    n = 40
    x = _randn(1, n, 32, seed=36)
    freqs_cis = Llama4TextRotaryEmbedding(config)(x, torch.arange(n)[None])
    with torch.no_grad():
        theirs, _ = layer(x, freqs_cis, _causal_float_mask(n))
        out, _ = ours(x, x, x, is_causal=True)
    assert_close(out, theirs, atol=1e-5, rtol=0)
    half_split = MultiHeadAttention(
        32,
        4,
        num_kv_heads=2,
        bias=False,
        rope=RotaryConfig(base=500000.0, scaling=scaling),
        dtype=DT,
    ).eval()
    half_split.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert not torch.allclose(
            half_split(x, x, x, is_causal=True)[0], theirs, atol=1e-3
        )


def test_new_scalings_and_temperatures_refuse_bad_input():
    llama3 = {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    with pytest.raises(ValueError, match="needs 'low_freq_factor'"):
        rope_frequencies(
            8,
            scaling={
                "type": "llama3",
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            },
        )
    with pytest.raises(ValueError, match="high_freq_factor'\\] must exceed"):
        rope_frequencies(8, scaling={**llama3, "high_freq_factor": 1.0})
    with pytest.raises(ValueError, match="low_freq_factor'\\] must be finite and > 0"):
        RotaryConfig(scaling={**llama3, "low_freq_factor": -1.0})
    with pytest.raises(
        TypeError, match="original_max_position_embeddings'\\] must be an int"
    ):
        rope_frequencies(
            8, scaling={**llama3, "original_max_position_embeddings": 8192.0}
        )
    with pytest.raises(
        ValueError,
        match=r"accepts the keys .*'beta_fast'.*got \['high_freq_factor', 'low_f",
    ):
        rope_frequencies(8, scaling={**llama3, "type": "yarn"})
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ValueError, match="needs 'original_max_position_embeddings'"):
        RotaryConfig(scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="beta_fast'\\] must exceed"):
        rope_frequencies(8, scaling={**yarn, "beta_fast": 1.0, "beta_slow": 2.0})
    with pytest.raises(ValueError, match="attention_factor'\\] must be finite and > 0"):
        RotaryConfig(scaling={**yarn, "attention_factor": 0.0})
    with pytest.raises(TypeError, match="truncate'\\] must be a bool"):
        rope_frequencies(8, scaling={**yarn, "truncate": 1})
    with pytest.raises(ValueError, match=r"YaRN scaling needs base > 1 .*, got 1.0"):
        RotaryConfig(base=1.0, scaling=yarn)
    with pytest.raises(ValueError, match="give the base as base="):
        rope_frequencies(8, scaling={**yarn, "rope_theta": 10000.0})
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        nope_temperature(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="positions must be >= 0, got a minimum of -1"):
        nope_temperature(torch.tensor([-1, 3]))
    with pytest.raises(ValueError, match="floor_scale must be >= 1, got 0"):
        nope_temperature(torch.tensor([1]), floor_scale=0)
    with pytest.raises(ValueError, match="attn_scale must be finite, got inf"):
        nope_temperature(torch.tensor([1]), attn_scale=math.inf)
    q = torch.randn(1, 5, 4)
    with pytest.raises(ValueError, match="i <= j is needed, got i=5 and j=3"):
        temperature_tuned_attention(q, torch.randn(1, 3, 4), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="not together with|both"):
        temperature_tuned_attention(
            q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True
        )
