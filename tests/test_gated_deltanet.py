"""Tests for attention/gated_deltanet.py: the layer against transformers' Qwen3-Next
layer (weights copied, float64), its state for decoding, and its boundary checks.

transformers' Qwen3-Next module is imported by the ``hf`` fixture, not at collection:
it brings in flash-linear-attention when that is installed, about 10 s of CPU. The
tests that compare with it are therefore slow (``make test``, not ``make check``).
"""

import inspect
import types

import pytest
import torch

from attention import GatedDeltaNet

F64 = torch.float64


@pytest.fixture(scope="module")
def hf():
    """transformers' Qwen3-Next modelling module (skips the test without it)."""
    return pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _config(hf, **overrides):
    kwargs = dict(
        hidden_size=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=3,
        linear_value_head_dim=5,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        vocab_size=10,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
    )
    kwargs.update(overrides)
    return hf.Qwen3NextConfig(**kwargs)


def _reference(hf, config, seed=0):
    """A float64 ``Qwen3NextGatedDeltaNet`` with every weight random (not its init)."""
    torch.manual_seed(seed)
    module = hf.Qwen3NextGatedDeltaNet(config, layer_idx=0).to(F64).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        module.norm.weight.add_(1.0)
    return module


class _TorchWithoutFloat32(types.ModuleType):
    """``torch`` as transformers' Qwen3-Next module sees it, float32 meaning float64."""

    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture
def torch_path(hf, monkeypatch):
    """transformers' torch path of the layer (never fla's or causal-conv1d's kernels,
    which it picks when they are installed and which need a GPU)."""
    for name in (
        "torch_chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule",
        "causal_conv1d_fn",
        "causal_conv1d_update",
    ):
        monkeypatch.setattr(hf, name, inspect.unwrap(getattr(hf, name)))


@pytest.fixture
def float64_path(hf, torch_path, monkeypatch):
    """The torch path computed in float64 throughout.

    The reference casts to float32 in three places whatever the input dtype: the delta
    rule (``.to(torch.float32)``), the gated RMSNorm (``.to(torch.float32)``) and the
    decay (``A_log.float()``, ``a.float()``). That is its choice for bfloat16 models; in
    a float64 comparison it would cap the agreement at float32's 1e-6. Here the module
    sees a ``torch`` whose ``float32`` is float64, and ``Tensor.float`` leaves a float64
    tensor alone; no other line of the reference changes.
    """
    monkeypatch.setattr(hf, "torch", _TorchWithoutFloat32("torch"))
    to_float = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor,
        "float",
        lambda self, *args, **kwargs: (
            self if self.dtype == F64 else to_float(self, *args, **kwargs)
        ),
    )


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", [64, 16, None])
@pytest.mark.parametrize("n", [1, 9, 70])
def test_equals_qwen3_next_gated_deltanet_in_float64(hf, float64_path, chunk_size, n):
    ref = _reference(hf, _config(hf))
    layer = GatedDeltaNet.from_transformers(ref, chunk_size=chunk_size)
    x = torch.randn(2, n, 16, dtype=F64, generator=torch.Generator().manual_seed(n))
    expected = ref(x)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("heads", [(2, 2), (1, 3)])
def test_equals_the_reference_for_other_head_layouts(hf, float64_path, heads):
    h, h_v = heads
    ref = _reference(
        hf,
        _config(
            hf,
            linear_num_key_heads=h,
            linear_num_value_heads=h_v,
            linear_conv_kernel_dim=2,
            rms_norm_eps=1e-3,
        ),
    )
    layer = GatedDeltaNet.from_transformers(ref)
    assert (layer.num_heads, layer.num_value_heads, layer.conv_size) == (h, h_v, 2)
    assert layer.norm_eps == 1e-3
    x = torch.randn(2, 11, 16, dtype=F64)
    torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=1e-10)


@pytest.mark.slow
def test_equals_the_reference_as_shipped_within_its_float32_steps(hf, torch_path):
    # unpatched, the reference computes its delta rule, decay and norm in float32
    ref = _reference(hf, _config(hf))
    layer = GatedDeltaNet.from_transformers(ref)
    x = torch.randn(2, 70, 16, dtype=F64)
    torch.testing.assert_close(layer(x), ref(x), rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_cached_decoding_equals_the_reference_cache_and_the_full_pass(hf, float64_path):
    from transformers.cache_utils import DynamicCache

    config = _config(hf)
    ref = _reference(hf, config)
    layer = GatedDeltaNet.from_transformers(ref)
    x = torch.randn(2, 9, 16, dtype=F64)
    cache = DynamicCache(config=config)
    expected = [ref(x[:, :5], cache=cache)]  # prefill, then one token at a time
    expected += [ref(x[:, t : t + 1], cache=cache) for t in range(5, 9)]
    out, state = layer(x[:, :5], output_final_state=True)
    outs = [out]
    for t in range(5, 9):
        out, state = layer(
            x[:, t : t + 1], initial_state=state, output_final_state=True
        )
        outs.append(out)
    torch.testing.assert_close(
        torch.cat(outs, dim=1), torch.cat(expected, dim=1), rtol=0, atol=1e-10
    )
    torch.testing.assert_close(torch.cat(outs, dim=1), layer(x), rtol=0, atol=1e-12)
    conv_state, memory = state
    assert conv_state.shape == (2, 3, 2 * 2 * 3 + 4 * 5) and memory.shape == (
        2,
        4,
        3,
        5,
    )
    torch.testing.assert_close(
        memory, cache.layers[0].recurrent_states[0], rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("pieces", [(1, 1, 1, 1, 1, 1, 1), (2, 5), (6, 1), (3, 4)])
def test_pieces_chained_through_the_state_equal_one_pass(pieces):
    torch.manual_seed(0)
    layer = GatedDeltaNet(
        12, 2, 4, num_value_heads=4, value_head_dim=3, chunk_size=2, dtype=F64
    )
    x = torch.randn(3, sum(pieces), 12, dtype=F64)
    state, outs, start = None, [], 0
    for size in pieces:
        out, state = layer(
            x[:, start : start + size], initial_state=state, output_final_state=True
        )
        outs.append(out)
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), layer(x), rtol=0, atol=1e-12)


@pytest.mark.slow  # a gradcheck: make test, not make check
def test_gradients_match_finite_differences():
    torch.manual_seed(0)
    layer = GatedDeltaNet(
        6,
        1,
        3,
        num_value_heads=2,
        value_head_dim=2,
        conv_size=2,
        chunk_size=2,
        dtype=F64,
    )
    x = torch.randn(1, 5, 6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    layer(x).square().sum().backward()
    assert all(
        p.grad is not None and p.grad.isfinite().all() for p in layer.parameters()
    )


def test_bfloat16_runs_in_float32_inside_and_returns_bfloat16():
    torch.manual_seed(0)
    layer = GatedDeltaNet(16, 2, 4, num_value_heads=4, dtype=F64)
    x = torch.randn(2, 20, 16, dtype=F64)
    low = layer.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert low.dtype == torch.bfloat16
    exact = layer.to(F64)(x)
    torch.testing.assert_close(low.double(), exact, rtol=0.05, atol=0.05)


def test_a_later_position_never_changes_an_earlier_output():
    torch.manual_seed(0)
    layer = GatedDeltaNet(8, 2, 4, dtype=F64)
    x = torch.randn(1, 10, 8, dtype=F64)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 8, dtype=F64)
    torch.testing.assert_close(layer(x)[:, :6], layer(y)[:, :6], rtol=0, atol=0)


@pytest.mark.slow
def test_from_transformers_copies_dtype_training_mode_and_refuses_others(hf):
    ref = _reference(hf, _config(hf)).train()
    layer = GatedDeltaNet.from_transformers(ref)
    assert layer.training and {p.dtype for p in layer.parameters()} == {F64}
    assert not GatedDeltaNet.from_transformers(ref.eval().float()).training
    with pytest.raises(TypeError, match="module must be a Qwen3NextGatedDeltaNet"):
        GatedDeltaNet.from_transformers(torch.nn.Linear(2, 2))
    gelu = _reference(hf, _config(hf, hidden_act="gelu"))
    with pytest.raises(ValueError, match="only the SiLU activation"):
        GatedDeltaNet.from_transformers(gelu)


def test_bad_input():
    layer = GatedDeltaNet(8, 2, 4, num_value_heads=4, dtype=F64)
    x = torch.randn(2, 5, 8, dtype=F64)
    with pytest.raises(ValueError, match=r"x must have shape \(b, n, embed_dim=8\)"):
        layer(x[..., :6])
    with pytest.raises(ValueError, match=r"x must have shape \(b, n, embed_dim=8\)"):
        layer(x[0])
    with pytest.raises(
        TypeError, match=r"x must have the dtype of the module's parameters"
    ):
        layer(x.float())
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer(x.tolist())
    with pytest.raises(TypeError, match="output_final_state must be a bool"):
        layer(x, output_final_state=1)
    _, (conv_state, memory) = layer(x, output_final_state=True)
    with pytest.raises(TypeError, match=r"initial_state must be None or the pair"):
        layer(x, initial_state=memory)
    with pytest.raises(ValueError, match=r"conv_state must have shape \(2, 3, 32\)"):
        layer(x, initial_state=(conv_state[:, :2], memory))
    with pytest.raises(ValueError, match=r"memory must have shape \(2, 4, 4, 4\)"):
        layer(x, initial_state=(conv_state, memory[:1]))
    with pytest.raises(TypeError, match="memory must have the dtype of x"):
        layer(x, initial_state=(conv_state, memory.float()))
    with pytest.raises(
        ValueError, match="num_value_heads must be a multiple of num_heads"
    ):
        GatedDeltaNet(8, 2, 4, num_value_heads=3)
    with pytest.raises(ValueError, match="conv_size must be >= 1"):
        GatedDeltaNet(8, 2, 4, conv_size=0)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        GatedDeltaNet(8, 2, 4.0)
    with pytest.raises(ValueError, match="norm_eps must be >= 0"):
        GatedDeltaNet(8, 2, 4, norm_eps=-1.0)
