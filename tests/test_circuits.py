"""Tests for attention.reading.circuits: circuits against the heads they factor
(float64), scores against naive loops over queries and keys, the attention-only model
against the package's MultiHeadAttention and autograd, and one test per bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    AttentionOnlyTransformer,
    MultiHeadAttention,
    copying_score,
    induction_score,
    ov_circuit,
    prefix_matching_score,
    previous_token_score,
    qk_circuit,
    split_heads,
)
from attention.reading.circuits import (
    AttentionOnlyTrace,
    composition_score,
    duplicate_token_score,
)

F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _maps(*shape, seed=0, causal=True):
    scores = torch.randn(*shape, generator=_gen(seed), dtype=F64)
    if causal:
        n = shape[-1]
        scores = scores.masked_fill(
            ~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")
        )
    return scores.softmax(-1)


# --------------------------------------------------------------------------- circuits


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_circuits_of_a_module_give_its_scores_and_outputs(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, bias=False, dtype=F64)
    x = torch.randn(1, 6, 16, dtype=F64)
    qk, ov = qk_circuit(mha), ov_circuit(mha)
    assert qk.shape == ov.shape == (4, 16, 16)
    q = split_heads(mha.w_query(x), 4)[0]  # (h, i, d)
    k = split_heads(mha.w_key(x), num_kv_heads)[0].repeat_interleave(
        4 // num_kv_heads, 0
    )
    assert_close(
        x[0] @ qk @ x[0].T, q @ k.transpose(-2, -1)
    )  # (h, i, j) unscaled scores
    out, w = mha(x, x, x, need_weights=True)
    per_head = torch.einsum("hij,jD,hDE->iE", w[0], x[0], ov)  # sum_n A_n x W_OV_n
    assert_close(per_head, out[0])
    for circuit in (qk, ov):  # rank <= d = 4 (exactly 4 for random weights)
        assert torch.linalg.matrix_rank(circuit).tolist() == [4, 4, 4, 4]


def test_circuits_of_torch_multihead_attention():
    torch.manual_seed(3)
    for kwargs in ({}, {"kdim": 6, "vdim": 5}):
        mha = torch.nn.MultiheadAttention(
            8, 2, bias=False, batch_first=True, dtype=F64, **kwargs
        )
        q = torch.randn(1, 4, 8, dtype=F64)
        k = torch.randn(1, 5, kwargs.get("kdim", 8), dtype=F64)
        v = torch.randn(1, 5, kwargs.get("vdim", 8), dtype=F64)
        out, w = mha(q, k, v, average_attn_weights=False)
        qk, ov = qk_circuit(mha), ov_circuit(mha)
        scores = torch.einsum("id,hde,je->hij", q[0], qk, k[0]) / 4**0.5
        assert_close(scores.softmax(-1), w[0])
        assert_close(torch.einsum("hij,jD,hDE->iE", w[0], v[0], ov), out[0])


def test_circuits_from_matrices():
    g = _gen(1)
    wq, wk = torch.randn(3, 8, 2, generator=g), torch.randn(3, 5, 2, generator=g)
    assert_close(qk_circuit(wq, wk), torch.stack([wq[n] @ wk[n].T for n in range(3)]))
    wv, wo = torch.randn(8, 2, generator=g), torch.randn(2, 8, generator=g)
    assert_close(ov_circuit(wv, wo), wv @ wo)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: qk_circuit(torch.ones(4, 2)),
            TypeError,
            "qk_circuit needs a MultiHeadAttention or both",
        ),
        (
            lambda: qk_circuit(torch.ones(4, 2), torch.ones(4, 3)),
            ValueError,
            "must share the head size d",
        ),
        (
            lambda: ov_circuit(torch.ones(4, 2), torch.ones(3, 4)),
            ValueError,
            "must share the head size d",
        ),
        (
            lambda: ov_circuit(torch.ones(4, 2, dtype=torch.long), torch.ones(2, 4)),
            TypeError,
            "w_value must have a floating-point dtype",
        ),
        (
            lambda: qk_circuit(MultiHeadAttention(4, 2), torch.ones(4, 2)),
            ValueError,
            "takes a MultiHeadAttention alone",
        ),
        (
            lambda: qk_circuit(torch.ones(4), torch.ones(4)),
            ValueError,
            "at least 2 dimensions",
        ),
        (
            lambda: qk_circuit(torch.ones(2, 4, 2), torch.ones(3, 4, 2)),
            ValueError,
            r"the batch dims of w_query and w_key must broadcast against each other, "
            r"got \(2,\) and \(3,\)",
        ),
        (
            lambda: ov_circuit(torch.ones(2, 4, 2), torch.ones(3, 2, 4)),
            ValueError,
            r"the batch dims of w_value and w_out must broadcast against each other",
        ),
        (
            lambda: qk_circuit(torch.ones(4, 2), torch.ones(4, 2, dtype=F64)),
            TypeError,
            "w_query and w_key must share a dtype, got torch.float32 and torch.float64",
        ),
        (
            lambda: copying_score(torch.ones(2, 4, 2), torch.ones(3, 2, 4)),
            ValueError,
            r"the batch dims of circuit and factor 0 must broadcast against each other",
        ),
        (
            lambda: copying_score(
                torch.ones(3, 4, 2), torch.ones(2, 4), torch.ones(2, 4, 4)
            ),
            ValueError,
            r"the batch dims of the product so far and factor 1 must broadcast",
        ),
        (
            lambda: copying_score(torch.ones(4, 2), torch.ones(2, 4, dtype=F64)),
            TypeError,
            "circuit and factor 0 must share a dtype",
        ),
    ],
)
def test_circuit_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_composition_score_against_its_definition():
    g = _gen(2)
    ov = torch.randn(2, 1, 6, 6, generator=g, dtype=F64)
    second = torch.randn(1, 3, 6, 6, generator=g, dtype=F64)
    got = {kind: composition_score(ov, second, kind=kind) for kind in "qkv"}
    for a, b in itertools.product(range(2), range(3)):
        o, m = ov[a, 0], second[0, b]
        for kind, prod in (("q", o @ m), ("k", o @ m.T), ("v", o @ m)):
            expected = torch.linalg.norm(prod) / (
                torch.linalg.norm(o) * torch.linalg.norm(m)
            )
            assert_close(got[kind][a, b], expected)
    assert got["k"].shape == (2, 3)
    assert bool(((got["k"] >= 0) & (got["k"] <= 1)).all())


def test_composition_score_is_one_for_aligned_rank_one_maps():
    u = torch.zeros(5, dtype=F64)
    u[2] = 1.0
    ov = torch.outer(u, u)
    assert_close(composition_score(ov, ov, kind="k"), torch.tensor(1.0, dtype=F64))


@pytest.mark.parametrize("kind", ["q", "k", "v"])
@pytest.mark.parametrize(
    "first, second, dtype",
    [
        (1e20, 1e20, torch.float32),
        (1e-30, 1e-30, torch.float32),
        (1e-30, 1.0, torch.float32),
        (3e4, 3e4, torch.float16),
        (1e300, 1e-300, F64),
    ],
)
def test_composition_score_is_scale_invariant(kind, first, second, dtype):
    """The score of two matrices equals the score of any positive multiples of them:
    eye(4) against eye(4) scores |I|_F / (|I|_F |I|_F) = 1/2 at every scale, even where
    the product of the norms overflows or underflows the dtype; random matrices score
    as in float64 at scale one."""
    eye = torch.eye(4, dtype=dtype)
    got = composition_score(eye * first, eye * second, kind=kind)
    assert_close(got, torch.tensor(0.5, dtype=dtype))
    g = _gen(5)
    ov, m = torch.randn(3, 4, 4, generator=g, dtype=F64).unbind(0)[:2]
    scaled = composition_score(
        (ov * first).to(dtype), (m * second).to(dtype), kind=kind
    )
    assert_close(
        scaled.double(), composition_score(ov, m, kind=kind), atol=2e-3, rtol=0
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "x"}, ValueError, "kind must be one of 'q', 'k', 'v'"),
        (
            {"circuit_second": torch.ones(3, 3)},
            ValueError,
            "must act on the same model size D",
        ),
        (
            {"circuit_second": torch.ones(3, 4)},
            ValueError,
            "circuit_second must be square",
        ),
        (
            {"ov_first": torch.ones(2, 4, 4), "circuit_second": torch.ones(3, 4, 4)},
            ValueError,
            r"the batch dims of ov_first and circuit_second must broadcast against "
            r"each other, got \(2,\) and \(3,\)",
        ),
        (
            {"circuit_second": torch.ones(4, 4, dtype=F64)},
            TypeError,
            "ov_first and circuit_second must share a dtype",
        ),
    ],
)
def test_composition_score_bad_inputs(kwargs, error, message):
    args = {"ov_first": torch.ones(4, 4), "circuit_second": torch.ones(4, 4)} | kwargs
    kind = args.pop("kind", "k")
    with pytest.raises(error, match=message):
        composition_score(args["ov_first"], args["circuit_second"], kind=kind)


def test_copying_score_against_eigenvalues_and_trace():
    c = torch.randn(4, 7, 7, generator=_gen(3), dtype=F64)
    eig = [torch.linalg.eigvals(m) for m in c]
    expected = torch.stack([e.real.sum() / e.abs().sum() for e in eig])
    got = copying_score(c)
    assert_close(got, expected)
    assert_close(
        got,
        torch.diagonal(c, dim1=-2, dim2=-1).sum(-1)
        / torch.stack([e.abs().sum() for e in eig]),
    )
    assert copying_score(torch.eye(3)).item() == 1.0
    rotation = torch.tensor(
        [[0.0, -1.0], [1.0, 0.0]]
    )  # eigenvalues +-i: moves, never copies
    assert abs(copying_score(rotation).item()) < 1e-6
    assert copying_score(torch.eye(3, dtype=torch.float32)).dtype == torch.float32
    with pytest.raises(ValueError, match="circuit must be square"):
        copying_score(torch.ones(2, 3))
    e, ov, u = (
        torch.randn(*shape, generator=_gen(4), dtype=F64)
        for shape in ((5, 3), (3, 3), (3, 5))
    )
    assert_close(copying_score(e, ov, u), copying_score(e @ ov @ u))
    with pytest.raises(ValueError, match="factor 1 of shape"):
        copying_score(e, ov, torch.ones(4, 5, dtype=F64))


# --------------------------------------------------------------------------- scores


def test_previous_token_score_against_a_loop():
    w = _maps(2, 3, 6, 6)
    expected = torch.tensor(
        [
            [sum(float(w[a, b, i, i - 1]) for i in range(1, 6)) / 5 for b in range(3)]
            for a in range(2)
        ],
        dtype=F64,
    )
    assert_close(previous_token_score(w), expected)
    assert_close(
        previous_token_score(torch.eye(5, dtype=F64).roll(-1, 1).tril()),
        torch.tensor(1.0, dtype=F64),
    )


def _naive_targets_score(w, targets_of):
    """Loop: mean over queries with targets of the weight on their targets (one map)."""
    n = w.shape[-1]
    shares = [
        sum(float(w[i, j]) for j in targets_of(i)) for i in range(n) if targets_of(i)
    ]
    return sum(shares) / len(shares) if shares else float("nan")


def test_induction_score_with_a_period_against_a_loop():
    w = _maps(3, 9, 9, seed=4)
    got = induction_score(w, 4)
    for h in range(3):
        assert_close(
            got[h].item(),
            _naive_targets_score(w[h], lambda i: [i - 3] if i >= 4 else []),
        )


def test_induction_score_with_positions_per_sequence():
    w = _maps(2, 3, 8, 8, seed=5)
    positions = torch.tensor([[-1, -1, -1, 1, 2, -1, -1, -1], [-1] * 6 + [3, 4]])
    got = induction_score(w, positions)
    for a, b in itertools.product(range(2), range(3)):
        targets = lambda i, a=a: [int(positions[a, i])] if positions[a, i] >= 0 else []
        assert_close(got[a, b].item(), _naive_targets_score(w[a, b], targets))
    shared = induction_score(w, positions[0])  # (n,) shared by every map
    assert_close(shared[0], got[0])
    no_target = induction_score(w, torch.full((8,), -1))
    assert bool(no_target.isnan().all())
    # a period p equals its positions written out
    period = torch.tensor([-1, -1, -1, 1, 2, 3, 4, 5])
    assert_close(induction_score(w, 3), induction_score(w, period))


@given(st.lists(st.integers(0, 3), min_size=2, max_size=9), st.booleans())
def test_token_scores_against_loops(tokens, is_causal):
    n = len(tokens)
    w = _maps(2, n, n, seed=n, causal=is_causal)
    t = torch.tensor(tokens)

    def prefix_targets(i):
        return [
            k + 1
            for k in range(n - 1)
            if tokens[k] == tokens[i] and (k < i if is_causal else k != i)
        ]

    def duplicate_targets(i):
        return [
            j
            for j in range(n)
            if tokens[j] == tokens[i] and (j < i if is_causal else j != i)
        ]

    pm = prefix_matching_score(w, t, is_causal=is_causal)
    dup = duplicate_token_score(w, t, is_causal=is_causal)
    for h in range(2):
        for got, targets in ((pm[h], prefix_targets), (dup[h], duplicate_targets)):
            expected = _naive_targets_score(w[h], targets)
            if expected != expected:  # NaN: no query has a target
                assert got.isnan()
            else:
                assert_close(got.item(), expected)


def test_repeated_random_tokens_induction_equals_prefix_matching():
    """On a sequence repeated with period p and no other duplicate, the two scores
    agree."""
    t = torch.randperm(6, generator=_gen(6))
    tokens = torch.cat([t, t])
    w = _maps(4, 12, 12, seed=7)
    assert_close(prefix_matching_score(w, tokens), induction_score(w, 6))
    perfect = torch.zeros(12, 12, dtype=F64)
    perfect[:6, 0] = 1.0
    perfect[torch.arange(6, 12), torch.arange(1, 7)] = 1.0
    assert induction_score(perfect, 6).item() == 1.0
    assert prefix_matching_score(perfect, tokens).item() == 1.0


def test_token_scores_per_sequence_batch():
    w = _maps(2, 3, 6, 6, seed=8)
    tokens = torch.tensor([[0, 1, 0, 1, 0, 1], [2, 2, 3, 3, 2, 2]])
    got = duplicate_token_score(w, tokens)
    for a in range(2):
        assert_close(got[a], duplicate_token_score(w[a], tokens[a]))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: previous_token_score(torch.ones(3, 4)),
            ValueError,
            "must be self-attention maps",
        ),
        (lambda: previous_token_score(torch.ones(1, 1)), ValueError, "needs n >= 2"),
        (
            lambda: previous_token_score(torch.ones(3, 3, dtype=torch.long)),
            TypeError,
            "floating-point",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), 4),
            ValueError,
            "period must be < n=4",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), 0),
            ValueError,
            "period must be >= 1",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), 1.5),
            TypeError,
            "period must be an int",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), torch.tensor([0, 1, 2, 4])),
            ValueError,
            r"positions must be -1 \(no induction key\) or in \[0, 4\)",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), torch.tensor([0.0, 1, 2, 3])),
            TypeError,
            "positions must be an integer tensor",
        ),
        (
            lambda: induction_score(torch.ones(4, 4), torch.tensor([0, 1, 2])),
            ValueError,
            "positions must have length n=4",
        ),
        (
            lambda: induction_score(
                torch.ones(2, 4, 4), torch.zeros(3, 4, dtype=torch.long)
            ),
            ValueError,
            r"positions of shape \(b, n\) needs weights \(b, ..., n, n\)",
        ),
        (
            lambda: prefix_matching_score(
                torch.ones(4, 4), torch.ones(1, 1, 4, dtype=torch.long)
            ),
            ValueError,
            r"tokens must be \(n,\) or \(b, n\)",
        ),
        (
            lambda: duplicate_token_score(
                torch.ones(4, 4), torch.ones(4, dtype=torch.long), is_causal=1
            ),
            TypeError,
            "is_causal must be a bool",
        ),
    ],
)
def test_score_bad_inputs(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_scores_propagate_nan():
    w = _maps(5, 5)
    w[2, 1] = float("nan")
    assert previous_token_score(w).isnan()
    assert induction_score(w, 2).isnan()


# --------------------------------------------------------------------------- the model


def _model(num_layers=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    return AttentionOnlyTransformer(
        11, 12, 3, num_layers, max_len=7, dtype=F64, **kwargs
    )


def test_model_matches_a_loop_over_layers_with_multihead_attention():
    model = _model()
    tokens = torch.randint(11, (2, 7), generator=_gen(9))
    trace = model.trace(tokens)
    assert isinstance(trace, AttentionOnlyTrace)
    x = model.embed(tokens) + model.pos_embed(torch.arange(7))
    assert_close(trace.residuals[0], x)
    for index, layer in enumerate(model.layers):
        out, w = layer(x, x, x, is_causal=True, need_weights=True)
        assert_close(trace.weights[index], w)
        assert_close(
            trace.contributions[index].sum(1), out
        )  # the layer = sum of its heads
        x = x + out
        assert_close(trace.residuals[index + 1], x)
    assert_close(trace.logits, x @ model.unembed.weight.T)
    logits, weights = model(tokens, need_weights=True)
    assert_close(logits, trace.logits)
    assert_close(weights, trace.weights)
    assert_close(model(tokens), trace.logits)


def test_model_is_causal_and_trains_with_autograd():
    model = _model(seed=1)
    tokens = torch.randint(11, (1, 7), generator=_gen(10))
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 11
    assert_close(
        model(tokens)[:, :5], model(changed)[:, :5]
    )  # the future cannot leak back
    small = AttentionOnlyTransformer(5, 4, 2, 1, max_len=3, dtype=F64)
    weight = small.layers[0].w_query.weight.detach().clone().requires_grad_()

    def loss(wq):
        with torch.nn.utils.stateless._reparametrize_module(
            small, {"layers.0.w_query.weight": wq}
        ):
            return small(torch.tensor([[0, 3, 1]])).logsumexp(-1).sum()

    assert torch.autograd.gradcheck(loss, (weight,))


def test_zero_layer_model_is_the_bigram_table():
    model = _model(num_layers=0)
    tokens = torch.randint(11, (2, 7), generator=_gen(11))
    expected = (
        model.embed(tokens) + model.pos_embed.weight[:7]
    ) @ model.unembed.weight.T
    assert_close(model(tokens), expected)
    trace = model.trace(tokens)
    assert trace.weights.shape == (0, 2, 3, 7, 7) and trace.contributions.shape == (
        0,
        2,
        3,
        7,
        12,
    )


def test_ablation_and_weights_hook():
    model = _model(seed=2)
    tokens = torch.randint(11, (2, 7), generator=_gen(12))
    full = model.trace(tokens)
    ablated = model.trace(tokens, ablate=[(1, 2)])
    assert_close(
        ablated.weights[1], full.weights[1]
    )  # layer 0 unchanged, so layer 1's maps too
    assert ablated.contributions[1, :, 2].abs().max().item() == 0.0
    assert_close(
        ablated.logits,
        (full.residuals[2] - full.contributions[1, :, 2]) @ model.unembed.weight.T,
    )
    seen = []
    hooked = model.trace(tokens, weights_hook=lambda layer, w: seen.append(layer))
    assert seen == [0, 1]
    assert_close(hooked.logits, full.logits)  # returning None keeps the maps
    uniform = model.trace(
        tokens,
        weights_hook=lambda layer, w: (
            torch.ones_like(w).tril() / torch.ones_like(w).tril().sum(-1, keepdim=True)
        ),
    )
    assert_close(
        uniform.weights[0, 0, 0, 3],
        torch.full((7,), 0.25, dtype=F64).masked_fill(torch.arange(7) > 3, 0),
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ablate": [(2, 0)]}, ValueError, r"ablate: \(layer, head\) must lie in"),
        ({"ablate": [0]}, TypeError, r"ablate must hold \(layer, head\) pairs"),
        ({"weights_hook": 3}, TypeError, "weights_hook must be callable"),
        (
            {"weights_hook": lambda layer, w: w.tolist()},
            TypeError,
            "the maps weights_hook returned for layer 0 must be a torch.Tensor, "
            "got list",
        ),
        (
            {"weights_hook": lambda layer, w: w[..., :2]},
            ValueError,
            r"the maps weights_hook returned for layer 0 must have the shape "
            r"\(b, h, n, n\) = \(1, 3, 3, 3\) of the maps it replaces, got "
            r"\(1, 3, 3, 2\)",
        ),
        (
            {"weights_hook": lambda layer, w: w.float()},
            TypeError,
            r"the maps weights_hook returned for layer 0 must have the dtype of the "
            r"layer's maps \(torch.float64\)",
        ),
        (
            {"tokens": torch.zeros(7, dtype=torch.long)},
            ValueError,
            r"tokens must be \(b, n\)",
        ),
        ({"tokens": torch.zeros(1, 8, dtype=torch.long)}, ValueError, "n <= max_len=7"),
        (
            {"tokens": torch.full((1, 3), 11)},
            ValueError,
            r"tokens must lie in \[0, 11\)",
        ),
        ({"tokens": torch.zeros(1, 3)}, TypeError, "tokens must be an integer tensor"),
    ],
)
def test_model_bad_inputs(kwargs, error, message):
    model = _model()
    tokens = kwargs.pop("tokens", torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(error, match=message):
        model(tokens, **kwargs)


def test_model_bad_construction():
    with pytest.raises(
        ValueError, match="embed_dim must be divisible by num_heads, got 10 and 3"
    ):
        AttentionOnlyTransformer(5, 10, 3, 1, max_len=4)
    with pytest.raises(ValueError, match="num_layers must be >= 0"):
        AttentionOnlyTransformer(5, 4, 2, -1, max_len=4)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got str"):
        AttentionOnlyTransformer(5, 4, 2, dtype="float64")
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        AttentionOnlyTransformer(5, 4, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="device must be a torch.device, a string"):
        AttentionOnlyTransformer(5, 4, 2, device=[0])
    with pytest.raises(ValueError, match="device is not a valid device: 'gpu0'"):
        AttentionOnlyTransformer(5, 4, 2, device="gpu0")
