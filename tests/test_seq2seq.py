"""Tests of attention/layers/seq2seq.py: the reversal data, the masks, the model and
training."""

import pytest
import torch

from attention import causal_mask
from attention.layers.seq2seq import (
    BOS,
    FIRST_SYMBOL,
    PAD,
    TinySeq2Seq,
    encoder_decoder_masks,
    greedy_decode,
    lookup_batch,
    reversal_batch,
    train_seq2seq,
)


def test_reversal_batch_is_correct():
    g = torch.Generator().manual_seed(0)
    src, tgt_in, tgt_out = reversal_batch(32, 7, 5, generator=g)
    for t in (src, tgt_in, tgt_out):
        assert t.shape == (32, 7) and t.dtype == torch.long
    for s, ti, to in zip(src.tolist(), tgt_in.tolist(), tgt_out.tolist(), strict=True):
        assert to == s[::-1]
        assert ti == [BOS] + to[:-1]
    assert src.min() >= FIRST_SYMBOL and src.max() < FIRST_SYMBOL + 5
    assert set(src.unique().tolist()) == set(range(FIRST_SYMBOL, FIRST_SYMBOL + 5))
    assert not (src == PAD).any() and not (src == BOS).any()


def test_reversal_batch_is_reproducible():
    a = reversal_batch(4, 6, 9, generator=torch.Generator().manual_seed(3))
    b = reversal_batch(4, 6, 9, generator=torch.Generator().manual_seed(3))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_reversal_batch_bad_arguments():
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        reversal_batch(2, 0, 5)
    with pytest.raises(TypeError, match="num_symbols must be an int"):
        reversal_batch(2, 3, 5.0)


def test_encoder_decoder_masks():
    enc, dec, cross = encoder_decoder_masks([3, 5], [2, 4], 5, 4)
    assert (
        enc.shape == (2, 1, 5) and dec.shape == (2, 4, 4) and cross.shape == (2, 1, 5)
    )
    assert enc[0, 0].tolist() == [True] * 3 + [False] * 2
    assert enc[1].all()
    assert torch.equal(cross, enc)
    assert torch.equal(dec[1], causal_mask(4))
    assert torch.equal(
        dec[0], causal_mask(4) & torch.tensor([True, True, False, False])
    )
    assert dec.any(-1).all()  # no fully masked row


def test_encoder_decoder_masks_errors():
    with pytest.raises(
        ValueError, match="one entry per sequence of the batch, got 2 and 3"
    ):
        encoder_decoder_masks([1, 2], [1, 2, 3], 3, 3)
    with pytest.raises(ValueError, match="at least one real token"):
        encoder_decoder_masks([0, 2], [1, 2], 3, 3)


def test_model_shapes_and_masks():
    torch.manual_seed(0)
    model = TinySeq2Seq(vocab_size=9, max_len=8, d_model=16)
    src = torch.randint(FIRST_SYMBOL, 9, (2, 8))
    tgt_in = torch.randint(1, 9, (2, 5))
    logits, w = model(
        src, tgt_in, src_lengths=[6, 8], tgt_lengths=[5, 3], need_weights=True
    )
    assert logits.shape == (2, 5, 9) and w.shape == (2, 5, 8)
    assert (w[0, :, 6:] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5))
    # padded source tokens do not change the real positions' outputs
    src2 = src.clone()
    src2[0, 6:] = PAD
    logits2, none = model(src2, tgt_in, src_lengths=[6, 8], tgt_lengths=[5, 3])
    assert none is None
    torch.testing.assert_close(logits2[0], logits[0])
    # the decoder is causal: changing a later input token leaves earlier outputs alone
    tgt2 = tgt_in.clone()
    tgt2[:, 3] = FIRST_SYMBOL
    torch.testing.assert_close(model(src, tgt2)[0][:, :3], model(src, tgt_in)[0][:, :3])


def test_model_errors():
    model = TinySeq2Seq(vocab_size=9, max_len=8, d_model=16)
    with pytest.raises(ValueError, match="more than max_len=8"):
        model(torch.full((1, 9), 2), torch.full((1, 3), 2))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 8\]"):
        model(torch.full((1, 4), 9), torch.full((1, 3), 2))
    with pytest.raises(ValueError, match="same batch size, got 1 and 2"):
        model(torch.full((1, 4), 2), torch.full((2, 3), 2))
    with pytest.raises(
        TypeError, match="src must have dtype torch.int64, got torch.float32"
    ):
        model(torch.full((1, 4), 2.0), torch.full((1, 3), 2))
    with pytest.raises(
        ValueError, match=r"tgt_in must be a \(b, n\) tensor of token ids"
    ):
        model(torch.full((1, 4), 2), torch.full((3,), 2))
    with pytest.raises(TypeError, match="need_weights must be a bool"):
        model(torch.full((1, 4), 2), torch.full((1, 3), 2), need_weights="no")


def train_short(seed=0, steps=100):
    torch.manual_seed(seed)
    model = TinySeq2Seq(vocab_size=8, max_len=6, d_model=32)
    losses = train_seq2seq(model, steps, batch_size=32, lr=1e-2, seed=seed)
    return model, losses


@pytest.fixture(scope="module")
def trained():
    return train_short()


@pytest.mark.slow  # trains a model: make test, not make check
def test_short_training_reduces_the_loss(trained):
    model, losses = trained
    assert len(losses) == 100
    assert sum(losses[-5:]) / 5 < 0.1 * sum(losses[:5]) / 5
    # the cross-attention weight on the expected (mirrored) source position grew
    batch = reversal_batch(64, 6, 6, generator=torch.Generator().manual_seed(123))
    _, w = model(batch.src, batch.tgt_in, need_weights=True)
    assert w.flip(-1).diagonal(dim1=-2, dim2=-1).mean() > 0.5


def test_training_is_deterministic():
    _, a = train_short(seed=1, steps=10)
    _, b = train_short(seed=1, steps=10)
    assert a == b  # bit for bit
    _, c = train_short(seed=2, steps=10)
    assert a != c


def test_greedy_decode_after_training(trained):
    model, _ = trained
    batch = reversal_batch(16, 6, 6, generator=torch.Generator().manual_seed(7))
    out = greedy_decode(model, batch.src)
    assert out.shape == (16, 6)
    assert (out == batch.tgt_out).float().mean() > 0.9


def test_train_accepts_an_iterable_and_restores_threads():
    torch.manual_seed(0)
    model = TinySeq2Seq(vocab_size=8, max_len=6, d_model=16)
    threads = torch.get_num_threads()
    seen = []

    def progress(it):  # stands in for tqdm
        for x in it:
            seen.append(x)
            yield x

    losses = train_seq2seq(model, progress(range(3)), batch_size=4)
    assert len(losses) == 3 and seen == [0, 1, 2]
    assert torch.get_num_threads() == threads
    assert not model.training


def test_train_errors():
    model = TinySeq2Seq(vocab_size=8, max_len=6, d_model=16)
    with pytest.raises(TypeError, match="model must be a TinySeq2Seq"):
        train_seq2seq(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="length must be <= model.max_len=6, got 7"):
        train_seq2seq(model, 1, length=7)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        train_seq2seq(model, -1)


def test_lookup_batch_matches_a_loop():
    g = torch.Generator().manual_seed(5)
    src, tgt_in, tgt_out = lookup_batch(16, 4, 6, generator=g)
    assert src.shape == (16, 8) and tgt_out.shape == tgt_in.shape == (16, 4)
    for row in range(16):
        pairs = dict(zip(src[row, 0::2].tolist(), src[row, 1::2].tolist()))
        assert sorted(pairs) == [2, 3, 4, 5]  # every key once
        assert tgt_out[row].tolist() == [pairs[2 + t] for t in range(4)]
        assert all(6 <= v < 12 for v in pairs.values())
    assert (tgt_in[:, 0] == 1).all() and torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])


def test_lookup_batch_bad_arguments():
    with pytest.raises(ValueError, match="num_pairs must be >= 1, got 0"):
        lookup_batch(2, 0, 5)
    with pytest.raises(TypeError, match="num_values must be an int"):
        lookup_batch(2, 3, 5.0)


def test_lookup_training_and_errors():
    torch.manual_seed(0)
    model = TinySeq2Seq(vocab_size=2 + 3 + 5, max_len=6, d_model=16)
    losses = train_seq2seq(model, 30, batch_size=16, lr=3e-3, seed=0, task="lookup")
    assert len(losses) == 30 and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="task must be 'reversal' or 'lookup'"):
        train_seq2seq(model, 1, task="sorting")
    with pytest.raises(
        ValueError,
        match=r"length must be <= 3 \(model.max_len=6 source positions\), got 4",
    ):
        train_seq2seq(model, 1, task="lookup", length=4)
    with pytest.raises(
        ValueError, match="the lookup task needs a vocabulary of more than"
    ):
        train_seq2seq(TinySeq2Seq(vocab_size=5, max_len=6, d_model=8), 1, task="lookup")
