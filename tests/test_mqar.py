"""Tests for attention/efficient/mqar.py: the layout of multi-query associative recall
batches."""

import pytest
import torch

from attention import mqar_batch


def batch(num_pairs=6, seq_len=40, vocab_size=64, batch_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return mqar_batch(
        num_pairs, seq_len, vocab_size, batch_size=batch_size, generator=g
    )


def test_shapes_dtypes_and_scored_positions():
    inputs, targets, scored = batch()
    assert inputs.shape == targets.shape == scored.shape == (16, 40)
    assert inputs.dtype == targets.dtype == torch.long and scored.dtype == torch.bool
    assert (scored.sum(-1) == 6).all()
    assert not scored[:, :12].any()  # the context itself is never scored
    assert (targets[~scored] == -100).all()


def test_every_scored_target_is_the_value_after_its_key_in_the_context():
    inputs, targets, scored = batch()
    for row in range(16):
        context = dict(
            zip(inputs[row, 0:12:2].tolist(), inputs[row, 1:12:2].tolist(), strict=True)
        )
        assert len(context) == 6  # distinct keys
        asked = inputs[row][scored[row]].tolist()
        assert sorted(asked) == sorted(context)  # each key asked exactly once
        for key, target in zip(asked, targets[row][scored[row]].tolist(), strict=True):
            assert context[key] == target


def test_token_ranges_and_filler():
    inputs, targets, scored = batch(vocab_size=30)
    keys, values = inputs[:, 0:12:2], inputs[:, 1:12:2]
    assert keys.min() >= 1 and keys.max() < 15
    assert values.min() >= 15 and values.max() < 30
    query_region = inputs[:, 12:]
    assert (query_region[~scored[:, 12:]] == 0).all()


def test_reproducible_with_a_generator_and_different_across_seeds():
    a, b = batch(seed=3), batch(seed=3)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(batch(seed=3)[0], batch(seed=4)[0])


def test_smallest_layout_fills_every_query_slot():
    inputs, _, scored = batch(num_pairs=4, seq_len=12, vocab_size=10)
    assert scored[:, 8:].all()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match=r"seq_len must be >= 3 \* num_pairs"):
        mqar_batch(4, 11, 64)
    with pytest.raises(ValueError, match="distinct keys"):
        mqar_batch(8, 40, 16)
    with pytest.raises(ValueError, match="num_pairs must be >= 1"):
        mqar_batch(0, 40, 64)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        mqar_batch(2, 40, 64, generator=0)
