"""Tests for multi-head latent attention and its latent cache, against transformers'
DeepseekV3.

transformers is imported by the tests that compare with it, not at collection (about
5 s of CPU); those tests are slow (``make test``, not ``make check``).
"""

import pytest
import torch

from attention import RotaryConfig
from attention.practice.latent import LatentKVCache, MultiHeadLatentAttention

D64 = torch.float64
DIMS = dict(kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def _config(**overrides):
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import (
        DeepseekV3Config,
    )

    kwargs = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=12,
        num_hidden_layers=1,
        vocab_size=16,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        **DIMS,
    )
    kwargs.update(overrides)
    config = DeepseekV3Config(**kwargs)
    config._attn_implementation = "eager"
    return config


def _reference(config, seed=0):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
    )

    torch.manual_seed(seed)
    module = DeepseekV3Attention(config, layer_idx=0).to(D64).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module


def _rope_cos_sin(config, positions):
    """HF's position_embeddings, computed independently in float64."""
    d = config.qk_rope_head_dim
    inv_freq = config.rope_parameters["rope_theta"] ** -(
        torch.arange(0, d, 2, dtype=D64) / d
    )
    angles = positions.to(D64)[..., None] * inv_freq  # (b, n, d/2)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _hf_forward(module, x, positions=None):
    b, n, _ = x.shape
    positions = torch.arange(n).expand(b, n) if positions is None else positions
    causal = torch.zeros(n, n, dtype=D64).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")
    )
    return module(x, _rope_cos_sin(module.config, positions), causal[None, None])[0]


@pytest.mark.slow
@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("interleave", [True, False])
def test_equals_deepseek_v3_attention(q_lora_rank, interleave):
    ref = _reference(_config(q_lora_rank=q_lora_rank, rope_interleave=interleave))
    mla = MultiHeadLatentAttention.from_transformers(ref)
    assert mla.rope.interleaved is interleave and mla.rope.base == 500.0
    assert mla.scale == pytest.approx(ref.scaling) == (6 + 4) ** -0.5
    x = torch.randn(2, 9, 32, dtype=D64)
    expected = _hf_forward(ref, x)
    # transformers' RMSNorm computes in float32 whatever the input, hence 1e-5, not
    # 1e-12
    for absorb in (False, True):
        out, weights = mla(x, absorb=absorb)
        assert weights is None
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_copy_has_the_module_dtype_device_training_mode_and_eps():
    ref = _reference(_config())
    ref.train()
    ref.kv_a_layernorm.variance_epsilon = ref.q_a_layernorm.variance_epsilon = 1e-3
    mla = MultiHeadLatentAttention.from_transformers(ref)
    assert mla.training and mla.norm_eps == 1e-3 and mla.kv_norm.eps == 1e-3
    assert {p.dtype for p in mla.parameters()} == {D64}
    assert {p.device for p in mla.parameters()} == {torch.device("cpu")}
    float_copy = MultiHeadLatentAttention.from_transformers(
        _reference(_config()).float()
    )
    assert {p.dtype for p in float_copy.parameters()} == {torch.float32}
    assert not float_copy.training


@pytest.mark.parametrize("q_lora_rank", [None, 6])
def test_absorbed_equals_materialised(q_lora_rank):
    torch.manual_seed(1)
    mla = MultiHeadLatentAttention(
        24,
        3,
        q_lora_rank=q_lora_rank,
        rope=RotaryConfig(interleaved=True),
        dtype=D64,
        **DIMS,
    )
    x = torch.randn(2, 11, 24, dtype=D64)
    for is_causal in (True, False):
        torch.testing.assert_close(
            mla(x, is_causal=is_causal, absorb=True)[0],
            mla(x, is_causal=is_causal)[0],
            atol=1e-12,
            rtol=0,
        )
    # gradients agree too: the absorbed form is the same function of the weights
    out_a, out_m = mla(x, absorb=True)[0], mla(x)[0]
    ga = torch.autograd.grad(out_a.square().sum(), mla.w_kv_up.weight)[0]
    gm = torch.autograd.grad(out_m.square().sum(), mla.w_kv_up.weight)[0]
    torch.testing.assert_close(ga, gm, atol=1e-10, rtol=0)


@pytest.mark.parametrize("absorb", [False, True])
def test_prefill_and_steps_through_the_cache_equal_the_full_forward(absorb):
    torch.manual_seed(2)
    mla = MultiHeadLatentAttention(32, 4, q_lora_rank=12, dtype=D64, **DIMS).eval()
    x = torch.randn(2, 10, 32, dtype=D64)
    full = mla(x)[0]
    cache = mla.new_cache(batch_size=2, max_len=12)
    with torch.inference_mode():
        outs = [
            mla(x[:, :4], cache=cache, absorb=absorb)[0],  # prefill 4
            mla(x[:, 4:7], cache=cache, absorb=absorb)[0],
        ]  # a chunk of 3 after the cache
        outs += [
            mla(x[:, t : t + 1], cache=cache, absorb=absorb)[0] for t in range(7, 10)
        ]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=0)
    assert cache.length == 10


def test_cache_stores_the_latent_and_rope_key_only():
    cache = LatentKVCache(
        3, 20, kv_lora_rank=16, qk_rope_head_dim=8, dtype=torch.bfloat16
    )
    assert cache.nbytes == 3 * 20 * (16 + 8) * 2
    tensors = [v for v in vars(cache).values() if isinstance(v, torch.Tensor)]
    assert sum(t.numel() for t in tensors) == 3 * 20 * (16 + 8)
    assert LatentKVCache.bytes_per_token(512, 64) == 576 * 2
    assert (
        LatentKVCache.bytes_per_token(512, 64, dtype=torch.float32, num_layers=61)
        == 576 * 4 * 61
    )
    # what the module caches is its normalised latent and its rotated shared key
    torch.manual_seed(3)
    mla = MultiHeadLatentAttention(32, 4, dtype=D64, **DIMS)
    x = torch.randn(1, 5, 32, dtype=D64)
    cache = mla.new_cache(1, 8)
    with torch.no_grad():
        mla(x, cache=cache)
        latent, k_rope = mla.w_kv_down(x).split([8, 4], dim=-1)
        torch.testing.assert_close(
            cache.buffer[:, :5, :8], mla.kv_norm(latent), atol=1e-12, rtol=0
        )
    angle = torch.arange(5, dtype=D64)[:, None] * 10000.0 ** -(
        torch.arange(0, 4, 2, dtype=D64) / 4
    )
    c, s = angle.cos(), angle.sin()
    a, b = k_rope[0, :, :2], k_rope[0, :, 2:]  # pairs (k, k + 2)
    rotated = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    torch.testing.assert_close(cache.buffer[0, :5, 8:], rotated, atol=1e-12, rtol=0)


def test_positions_only_matter_through_their_differences():
    torch.manual_seed(4)
    mla = MultiHeadLatentAttention(32, 4, dtype=D64, **DIMS)
    x = torch.randn(2, 6, 32, dtype=D64)
    shifted = torch.stack([torch.arange(6) + 100, torch.arange(6) + 7])  # (b, n)
    torch.testing.assert_close(
        mla(x, positions=shifted)[0], mla(x)[0], atol=1e-10, rtol=0
    )
    out_default = mla(x[:, :1], positions=torch.tensor([3]))[0]
    assert out_default.shape == (2, 1, 32)


@pytest.mark.slow
def test_from_transformers_refuses_what_it_does_not_support():
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 500.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    with pytest.raises(
        ValueError, match="only the default RoPE is supported, got rope_type='yarn'"
    ):
        MultiHeadLatentAttention.from_transformers(
            _reference(_config(rope_parameters=yarn))
        )
    with pytest.raises(ValueError, match="attention biases are not supported"):
        MultiHeadLatentAttention.from_transformers(
            _reference(_config(attention_bias=True))
        )
    with pytest.raises(
        ValueError, match="num_key_value_heads must equal num_attention_heads"
    ):
        MultiHeadLatentAttention.from_transformers(
            _reference(_config(num_key_value_heads=2))
        )
    with pytest.raises(TypeError, match="module must be a DeepseekV3Attention"):
        MultiHeadLatentAttention.from_transformers(torch.nn.Linear(2, 2))


def test_ranks_that_do_not_fit():
    with pytest.raises(ValueError, match="kv_lora_rank must not exceed embed_dim"):
        MultiHeadLatentAttention(
            16, 4, kv_lora_rank=17, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5
        )
    with pytest.raises(
        ValueError, match=r"kv_lora_rank must not exceed .*1 \* \(2 \+ 2\) = 4"
    ):
        MultiHeadLatentAttention(
            16, 1, kv_lora_rank=5, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2
        )
    with pytest.raises(ValueError, match="q_lora_rank must not exceed embed_dim"):
        MultiHeadLatentAttention(16, 4, q_lora_rank=32, **DIMS)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MultiHeadLatentAttention(
            16, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=3, v_head_dim=5
        )
    with pytest.raises(ValueError, match="kv_lora_rank must be >= 1"):
        MultiHeadLatentAttention(
            16, 4, kv_lora_rank=0, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5
        )
    with pytest.raises(
        TypeError, match="rope must be a RotaryConfig or None, got bool"
    ):
        MultiHeadLatentAttention(16, 4, rope=True, **DIMS)
    with pytest.raises(TypeError, match="rope_base"):  # RotaryConfig is the one way
        MultiHeadLatentAttention(16, 4, rope_base=10.0, **DIMS)
    with pytest.raises(ValueError, match="NTK scaling needs d >= 4"):
        MultiHeadLatentAttention(
            16,
            4,
            rope=RotaryConfig(scaling={"type": "ntk", "factor": 2}),
            **{**DIMS, "qk_rope_head_dim": 2},
        )


def test_constructor_checks_dtype_and_device():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got str"):
        MultiHeadLatentAttention(16, 4, dtype="float64", **DIMS)
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        MultiHeadLatentAttention(16, 4, dtype=torch.int64, **DIMS)
    with pytest.raises(TypeError, match="device must be a torch.device, a string"):
        MultiHeadLatentAttention(16, 4, device=1.5, **DIMS)
    with pytest.raises(ValueError, match="device is not a valid device: 'gpu0'"):
        MultiHeadLatentAttention(16, 4, device="gpu0", **DIMS)


def test_bad_forward_arguments():
    mla = MultiHeadLatentAttention(16, 4, **DIMS)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match=r"x must have shape \(b, n, embed_dim=16\)"):
        mla(torch.randn(2, 3, 8))
    with pytest.raises(
        TypeError,
        match=r"x must have the dtype of the module's parameters \(torch.float32\)",
    ):
        mla(x.double())
    with pytest.raises(TypeError, match="absorb must be a bool"):
        mla(x, absorb=1)
    with pytest.raises(ValueError, match=r"positions must have shape \(n,\) = \(3,\)"):
        mla(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        mla(x, positions=torch.arange(3.0))
    with pytest.raises(ValueError, match="the cache was built for batch size 1, got 2"):
        mla(x, cache=mla.new_cache(1, 4))
    with pytest.raises(ValueError, match="the cache holds latents of 4"):
        mla(x, cache=LatentKVCache(2, 4, kv_lora_rank=4, qk_rope_head_dim=4))
    with pytest.raises(TypeError, match="cache must be a LatentKVCache"):
        mla(x, cache="cache")
    cache = mla.new_cache(2, 4)
    mla(x, cache=cache)
    with pytest.raises(ValueError, match="3 are stored and 3 more do not fit"):
        mla(x, cache=cache)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        LatentKVCache(1, 0, kv_lora_rank=4, qk_rope_head_dim=4)
