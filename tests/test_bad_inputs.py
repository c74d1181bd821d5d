"""Bad input, class by class, for the names added with the position, memory-efficient,
distributed and inference chapters, and the inputs an adversarial review found
mishandled.

Each row: a call, the exception it must raise at the boundary and a pattern its message
must match (naming the parameter and the rule). Silent results are tested too: NaN must
propagate or be refused, never turn into a plausible number.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention import (
    KVCache,
    LatentKVCache,
    LocalAlignment,
    NeuralMemory,
    PagedKVCache,
    RotaryConfig,
    StreamingKVCache,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    attention_with_sinks,
    dual_chunk_positions,
    entropy,
    global_tokens_mask,
    hard_attention,
    linear_attention,
    lsh_attention,
    online_softmax,
    qk_norm,
    relative_position_bucket,
    ring_attention,
    rope_frequencies,
    scaled_dot_product_attention,
    sinusoidal_positions,
    soft_cap,
    tiled_attention,
)
from attention.efficient.approximate import lsh_buckets
from attention.efficient.distributed import shard_sequence, unshard_sequence
from attention.layers.alignment import local_alignment, local_window
from attention.layers.scoring import cosine_scores
from attention.layers.seq2seq import TinySeq2Seq, encoder_decoder_masks, train_seq2seq
from attention.practice.pretrained import (
    minilm_attention_layer,
    minilm_attention_weights,
    token_position,
    trace_attention,
)
from attention.practice.sinks import sink_attention_weights, streaming_mask
from attention.reading.weights import differential_attention, sigmoid_attention

NAN = math.nan
X = torch.randn(2, 3, 4, 8)

CASES = {
    # wrong type: a non-tensor, a non-floating tensor, a float or bool for an int
    "sinusoidal_positions n float": (
        lambda: sinusoidal_positions(4.0, 4),
        TypeError,
        "n must be an int",
    ),
    "sinusoidal_positions dtype int": (
        lambda: sinusoidal_positions(4, 4, dtype=torch.long),
        TypeError,
        "dtype must be a floating-point dtype",
    ),
    "rope_frequencies d bool": (
        lambda: rope_frequencies(True),
        TypeError,
        "d must be an int, got bool",
    ),
    "rope_frequencies scaling list": (
        lambda: rope_frequencies(4, scaling=[]),
        TypeError,
        "scaling must be a dict or None",
    ),
    "apply_rope None": (
        lambda: apply_rope(None),
        TypeError,
        "x must be a torch.Tensor",
    ),
    "apply_rope int": (
        lambda: apply_rope(torch.ones(3, 4, dtype=torch.long)),
        TypeError,
        "x must have a floating-point dtype",
    ),
    "apply_rope float positions": (
        lambda: apply_rope(torch.ones(3, 4), torch.ones(3)),
        TypeError,
        "positions must be an integer tensor",
    ),
    "apply_rope interleaved int": (
        lambda: apply_rope(torch.ones(3, 4), interleaved=1),
        TypeError,
        "interleaved must be a bool",
    ),
    "alibi_slopes float": (
        lambda: alibi_slopes(2.0),
        TypeError,
        "num_heads must be an int",
    ),
    "alibi_bias j None": (
        lambda: alibi_bias(2, 3, None),
        TypeError,
        "j must be an int",
    ),
    "alibi_bias dtype int": (
        lambda: alibi_bias(2, 3, 3, dtype=torch.long),
        TypeError,
        "dtype must be a floating-point dtype",
    ),
    "relative_position_bucket float": (
        lambda: relative_position_bucket(torch.ones(3)),
        TypeError,
        "relative_position must be an integer tensor",
    ),
    "relative_position_bucket None": (
        lambda: relative_position_bucket(None),
        TypeError,
        "relative_position must be a torch.Tensor",
    ),
    "attention_with_sinks None": (
        lambda: attention_with_sinks(X, X, X, None),
        TypeError,
        "sinks must be a torch.Tensor",
    ),
    "attention_with_sinks int": (
        lambda: attention_with_sinks(X, X, X, torch.zeros(3, dtype=torch.long)),
        TypeError,
        "sinks must have a floating-point dtype",
    ),
    "sink_attention_weights None": (
        lambda: sink_attention_weights(X, X, None),
        TypeError,
        "sinks must be a torch.Tensor",
    ),
    "KVCache dtype int": (
        lambda: KVCache(1, 4, 2, 3, dtype=torch.long),
        TypeError,
        "dtype must be a floating-point dtype",
    ),
    "KVCache.update None": (
        lambda: KVCache(1, 4, 2, 3).update(None, None),
        TypeError,
        "key must be a torch.Tensor",
    ),
    "LatentKVCache.update None": (
        lambda: LatentKVCache(1, 4, 2, 2).update(None, None),
        TypeError,
        "latent must be a torch.Tensor",
    ),
    "LatentKVCache.bytes_per_token dtype": (
        lambda: LatentKVCache.bytes_per_token(4, 2, dtype="half"),
        TypeError,
        "dtype must be a torch.dtype",
    ),
    "soft_cap None": (
        lambda: soft_cap(None, 1.0),
        TypeError,
        "scores must be a torch.Tensor",
    ),
    "qk_norm None": (lambda: qk_norm(None), TypeError, "x must be a torch.Tensor"),
    "online_softmax None": (
        lambda: online_softmax(None),
        TypeError,
        "x must be a torch.Tensor",
    ),
    "tiled_attention return_lse int": (
        lambda: tiled_attention(X, X, X, return_lse=1),
        TypeError,
        "return_lse must be a bool",
    ),
    "shard_sequence None": (
        lambda: shard_sequence(None, 0, 2),
        TypeError,
        "x must be a torch.Tensor",
    ),
    "unshard_sequence empty": (
        lambda: unshard_sequence([]),
        TypeError,
        "shards must be a non-empty list or tuple",
    ),
    # wrong value: negative sizes, odd sizes, non-positive or NaN bases and caps,
    # windows
    "sinusoidal_positions n negative": (
        lambda: sinusoidal_positions(-1, 4),
        ValueError,
        "n must be >= 0, got -1",
    ),
    "sinusoidal_positions d odd": (
        lambda: sinusoidal_positions(4, 3),
        ValueError,
        "d must be even",
    ),
    "sinusoidal_positions base nan": (
        lambda: sinusoidal_positions(4, 4, base=NAN),
        ValueError,
        "base must be finite and > 0, got nan",
    ),
    "rope_frequencies base 0": (
        lambda: rope_frequencies(4, base=0.0),
        ValueError,
        "base must be finite and > 0",
    ),
    "apply_rope odd": (
        lambda: apply_rope(torch.ones(3, 5)),
        ValueError,
        "the last dimension d of x must be even",
    ),
    "apply_rope 1-d": (
        lambda: apply_rope(torch.ones(4)),
        ValueError,
        "x must have at least 2 dimensions",
    ),
    "apply_rope meta positions": (
        lambda: apply_rope(torch.ones(3, 4), torch.arange(3, device="meta")),
        ValueError,
        "same device",
    ),
    "alibi_slopes 0": (
        lambda: alibi_slopes(0),
        ValueError,
        "num_heads must be >= 1, got 0",
    ),
    "alibi_bias i negative": (
        lambda: alibi_bias(2, -1, 3),
        ValueError,
        "i must be >= 0, got -1",
    ),
    "relative_position_bucket 0 buckets": (
        lambda: relative_position_bucket(torch.arange(3), num_buckets=0),
        ValueError,
        "num_buckets must be >= 1",
    ),
    "attention_with_sinks shape": (
        lambda: attention_with_sinks(X, X, X, torch.zeros(4)),
        ValueError,
        r"sinks must have shape \(h,\) = \(3,\)",
    ),
    "streaming_mask num_sink": (
        lambda: streaming_mask(4, -1, 2),
        ValueError,
        "num_sink must be >= 0, got -1",
    ),
    "streaming_mask window": (
        lambda: streaming_mask(4, 1, 0),
        ValueError,
        "window must be >= 1, got 0",
    ),
    "StreamingKVCache batch": (
        lambda: StreamingKVCache(0, 1, 2, 2, 3),
        ValueError,
        "batch_size must be >= 1",
    ),
    "KVCache batch 0": (
        lambda: KVCache(0, 4, 2, 3),
        ValueError,
        "batch_size must be >= 1, got 0",
    ),
    "PagedKVCache 0 blocks": (
        lambda: PagedKVCache(0, 2, 2, 3),
        ValueError,
        "num_blocks must be >= 1, got 0",
    ),
    "LatentKVCache max_len 0": (
        lambda: LatentKVCache(1, 0, 2, 2),
        ValueError,
        "max_len must be >= 1, got 0",
    ),
    "soft_cap 0": (
        lambda: soft_cap(X, 0.0),
        ValueError,
        "cap must be finite and > 0, got 0.0",
    ),
    "soft_cap nan": (
        lambda: soft_cap(X, NAN),
        ValueError,
        "cap must be finite and > 0, got nan",
    ),
    "dual_chunk_positions n": (
        lambda: dual_chunk_positions(-1, chunk_size=2),
        ValueError,
        "n must be >= 0, got -1",
    ),
    "dual_chunk_positions chunk": (
        lambda: dual_chunk_positions(4, chunk_size=0),
        ValueError,
        "chunk_size must be >= 1, got 0",
    ),
    "dual_chunk_positions window": (
        lambda: dual_chunk_positions(4, chunk_size=2, local_window=2),
        ValueError,
        "local_window must be smaller than chunk_size",
    ),
    "online_softmax dim": (
        lambda: online_softmax(X, dim=5),
        ValueError,
        r"dim must lie in \[-4, 3\]",
    ),
    "online_softmax block": (
        lambda: online_softmax(X, block_size=0),
        ValueError,
        "block_size must be >= 1, got 0",
    ),
    "tiled_attention block": (
        lambda: tiled_attention(X, X, X, block_size=0),
        ValueError,
        "block_size must be >= 1, got 0",
    ),
    "ring_attention without a process group": (
        lambda: ring_attention(X, X, X),
        ValueError,
        "needs an initialised process group",
    ),
    "shard_sequence divisibility": (
        lambda: shard_sequence(X, 3, 2),
        ValueError,
        "divisible by P = 3",
    ),
    # the review's list: the parameter named in the message is the one the caller passed
    "global_tokens_mask names n": (
        lambda: global_tokens_mask(-1, 1, [0]),
        ValueError,
        "n must be >= 0, got -1",
    ),
    "encoder_decoder_masks names src_len": (
        lambda: encoder_decoder_masks(torch.tensor([2]), torch.tensor([2]), -1, 3),
        ValueError,
        "src_len must be >= 0, got -1",
    ),
    "encoder_decoder_masks names tgt_len": (
        lambda: encoder_decoder_masks(torch.tensor([2]), torch.tensor([2]), 3, -1),
        ValueError,
        "tgt_len must be >= 0, got -1",
    ),
    # deep errors that became boundary errors
    "hard_attention batch dims": (
        lambda: hard_attention(torch.rand(2, 3, 5), torch.randn(4, 5, 2)),
        ValueError,
        "the batch dims of weights and value",
    ),
    "linear_attention map changes dtype": (
        lambda: linear_attention(
            torch.randn(3, 4),
            torch.randn(3, 4),
            torch.randn(3, 2),
            feature_map=lambda x: torch.relu(x).double(),
        ),
        TypeError,
        "feature_map must keep the dtype of its input",
    ),
    "minilm_attention_weights model None": (
        lambda: minilm_attention_weights(None, 0, torch.zeros(2, 4)),
        TypeError,
        "model must be a transformers model",
    ),
    "minilm_attention_layer model None": (
        lambda: minilm_attention_layer(None, 0),
        TypeError,
        "model must be a transformers model",
    ),
    "minilm_attention_layer not BERT": (
        lambda: minilm_attention_layer(torch.nn.Linear(2, 2), 0),
        TypeError,
        "model must be a transformers model",
    ),
    "trace_attention model None": (
        lambda: trace_attention(None, None, "a cat"),
        TypeError,
        "model must be a transformers model",
    ),
    "token_position tokens None": (
        lambda: token_position(None, "a"),
        TypeError,
        "tokens must be a list of strings, got NoneType",
    ),
    "token_position token int": (
        lambda: token_position(["a"], 1),
        TypeError,
        "token must be a string, got int",
    ),
    "train_seq2seq steps tensor": (
        lambda: train_seq2seq(TinySeq2Seq(8, 5), steps=torch.tensor(3)),
        TypeError,
        r"steps must be an int or an iterable .* got a Tensor",
    ),
    # silent results that are refused now
    "entropy of negative weights": (
        lambda: entropy(torch.tensor([0.5, -0.5, 1.0])),
        ValueError,
        "weights must be probabilities",
    ),
    "lsh_buckets NaN": (
        lambda: lsh_buckets(torch.tensor([[NAN, 1.0], [1.0, 0.0]]), num_buckets=2),
        ValueError,
        "x holds NaN",
    ),
    "local_window NaN centre": (
        lambda: local_window(torch.tensor([NAN]), 5, 2.0),
        ValueError,
        "centre holds NaN",
    ),
}


@pytest.mark.parametrize("call, error, message", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_refused_at_the_boundary(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_nan_centre_gives_a_nan_row_not_zero_weights():
    scores = torch.randn(2, 5, dtype=torch.float64)
    weights = local_alignment(
        scores, torch.tensor([NAN, 2.0], dtype=torch.float64), 2.0
    )
    assert weights[0].isnan().all() and torch.isfinite(weights[1]).all()
    align = LocalAlignment(4, 3, 2.0).double()
    query = torch.tensor([[NAN, 0, 0, 0], [1.0, 0, 0, 0]], dtype=torch.float64)
    context, weights = align(query, scores, torch.randn(5, 2, dtype=torch.float64))
    assert (
        weights[0].isnan().all()
        and context[0].isnan().all()
        and torch.isfinite(context[1]).all()
    )


def test_sinks_holding_nan_propagate():
    out = attention_with_sinks(X, X, X, torch.full((3,), NAN))
    assert out.isnan().all()


def test_cosine_scores_normalise_before_the_product():
    big = torch.full((2, 3), 1e30)  # |q||k| = 3e60 overflows float32; the cosine is 1
    torch.testing.assert_close(cosine_scores(big, big), torch.ones(2, 2))
    torch.testing.assert_close(cosine_scores(-big, big), -torch.ones(2, 2))
    q, k = (
        torch.randn(4, 6, dtype=torch.float64),
        torch.randn(5, 6, dtype=torch.float64),
    )
    expected = (q @ k.T) / (q.norm(dim=-1)[:, None] * k.norm(dim=-1)[None])
    torch.testing.assert_close(cosine_scores(q, k), expected)
    small = torch.tensor(
        [[1e-6, 0.0]], dtype=torch.float64
    )  # |q||k| = 1e-9 < eps: damped as before
    torch.testing.assert_close(
        cosine_scores(small, 1000 * small), torch.tensor([[0.1]], dtype=torch.float64)
    )
    assert cosine_scores(torch.zeros(1, 2), torch.ones(1, 2)).item() == 0.0
    assert cosine_scores(torch.tensor([[NAN, 0.0]]), torch.ones(1, 2)).isnan().all()


def test_meta_tensors_pass_through_like_torch():
    meta = dict(device="meta")
    q, k, v = (
        torch.empty(2, 6, 4, **meta),
        torch.empty(2, 6, 4, **meta),
        torch.empty(2, 6, 3, **meta),
    )
    for causal in (False, True):
        out = linear_attention(q, k, v, feature_map=torch.relu, is_causal=causal)
        assert out.device.type == "meta" and out.shape == (2, 6, 3)
    out = lsh_attention(
        k, k, v, num_buckets=2, chunk_size=3, generator=torch.Generator().manual_seed(0)
    )
    assert out.device.type == "meta" and out.shape == (2, 6, 3)


HUGE = 10**400  # an int that no float holds: float(HUGE) raises OverflowError
X2 = torch.randn(3, 4)
HUGE_REALS = {
    "scaled_dot_product_attention scale": lambda: scaled_dot_product_attention(
        X2, X2, X2, scale=HUGE
    ),
    "sinusoidal_positions base": lambda: sinusoidal_positions(4, 4, base=HUGE),
    "rope_frequencies base": lambda: rope_frequencies(4, base=HUGE),
    "apply_rope base": lambda: apply_rope(X2, base=-HUGE),
    "RotaryConfig base": lambda: RotaryConfig(base=HUGE),
    "RotaryConfig scaling factor": lambda: RotaryConfig(
        scaling={"type": "linear", "factor": HUGE}
    ),
    "linear_attention eps": lambda: linear_attention(X2, X2, X2, eps=HUGE),
    "linear_attention decay": lambda: linear_attention(
        X2, X2, X2, is_causal=True, decay=-HUGE
    ),
    "soft_cap cap": lambda: soft_cap(X2, HUGE),
    "qk_norm eps": lambda: qk_norm(X2, eps=HUGE),
    "cosine_scores eps": lambda: cosine_scores(X2, X2, eps=HUGE),
    "local_window half_width": lambda: local_window(torch.tensor([1.0]), 5, HUGE),
    "sigmoid_attention bias": lambda: sigmoid_attention(X2, X2, X2, bias=HUGE),
    "differential_attention lam": lambda: differential_attention(
        X2, X2, X2, X2, X2, HUGE
    ),
    "NeuralMemory learning_rate": lambda: NeuralMemory(4, 3, learning_rate=HUGE),
}


@pytest.mark.parametrize("call", list(HUGE_REALS.values()), ids=list(HUGE_REALS))
def test_a_real_too_large_for_a_float_is_a_value_error(call):
    """Every real parameter goes through check_real, which names the parameter and the
    rule instead of letting float() raise OverflowError."""
    with pytest.raises(
        ValueError,
        match=r"must be a number a float can hold \(magnitude at most 1.798e\+308\), "
        r"got int of about 1e400",
    ):
        call()
