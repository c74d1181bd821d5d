"""The shared boundary checks (attention/_checks.py) and cores (attention/_core.py)."""

import pytest
import torch
import torch.nn.functional as F

from attention import _checks, _core
from attention._checks import (
    check_bool,
    check_choice,
    check_device,
    check_dim,
    check_dtype,
    check_factory,
    check_generator,
    check_int,
    check_like,
    check_positive,
    check_probability,
    check_qkv,
    check_real,
    check_same_device,
    check_scale,
    check_size,
    validate_attention,
)
from attention.foundations import scaled_dot_product
from attention.layers import additive, alignment

f64 = torch.float64
T = lambda *s, dtype=f64: torch.zeros(*s, dtype=dtype)


# ---------------------------------------------------------- one masked softmax, one GQA


def test_every_masked_softmax_of_the_package_behaves_as_torchs_sdpa_weights():
    """The weights of the reference kernel, the multi-dimensional and the soft
    alignments all follow one rule: torch's masked softmax, zeros for a row with no
    visible key (with finite gradients), NaN for a NaN score even where masked."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 5, dtype=f64, generator=g, requires_grad=True)
    mask = torch.rand(3, 4, 5, generator=g) > 0.4
    mask[:, 1] = False  # one query sees no key
    expected = torch.softmax(scores.detach().masked_fill(~mask, float("-inf")), dim=-1)
    expected = expected.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    eye = torch.eye(5, dtype=f64)
    ways = {
        "attention_weights": lambda s, m: scaled_dot_product.attention_weights(
            s, eye, attn_mask=m, scale=1.0
        ),
        "soft_alignment": lambda s, m: alignment.soft_alignment(s, attn_mask=m),
        "multidimensional_weights": lambda s, m: additive.multidimensional_weights(
            s[..., None], attn_mask=m
        )[..., 0],
    }
    for name, way in ways.items():
        got = way(scores, mask)
        torch.testing.assert_close(got, expected, msg=name)
        (grad,) = torch.autograd.grad(got.sum(), scores)
        assert torch.isfinite(grad).all(), name
        poisoned = scores.detach().clone()
        poisoned[0, 0, 0] = float("nan")
        hidden = mask.clone()
        hidden[0, 0, 0] = False
        assert torch.isnan(way(poisoned, hidden)[0, 0]).all(), name


@pytest.mark.parametrize("dim", [-1, -2, 0])
def test_masked_softmax_equals_torch_reference(dim):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 5, dtype=f64, generator=g)
    mask = torch.rand(3, 4, 5, generator=g) > 0.4
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    dead = (~mask).all(dim=dim, keepdim=True)
    expected = expected.masked_fill(dead, 0.0)  # torch's SDPA: no visible key -> zeros
    torch.testing.assert_close(_core.masked_softmax(scores, mask, dim=dim), expected)


def test_masked_softmax_dead_rows_have_zero_weights_and_finite_gradients():
    scores = torch.randn(2, 3, dtype=f64, requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    w = _core.masked_softmax(scores, mask)
    assert torch.equal(w[1], torch.zeros(3, dtype=f64))
    w.sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert _core.masked_softmax(torch.zeros(2, 0, dtype=f64)).shape == (2, 0)


@pytest.mark.parametrize("repeats", [1, 2, 4])
def test_expand_kv_heads_is_repeat_interleave(repeats):
    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(
        _core.expand_kv_heads(x, 3 * repeats), x.repeat_interleave(repeats, dim=-3)
    )


def test_default_scale():
    assert _core.default_scale(None, 16) == 0.25
    assert _core.default_scale(None, 0) == 1.0  # no ZeroDivisionError for d = 0
    assert _core.default_scale(2, 16) == 2.0


# ---------------------------------------------------------------- validate_attention


def test_validate_attention_returns_the_scores_shape():
    shape = validate_attention(
        T(2, 1, 8, 3, 4), T(5, 2, 7, 4), T(5, 2, 7, 6), enable_gqa=True
    )
    assert shape == (2, 5, 8, 3, 7)
    assert validate_attention(T(3, 4), T(7, 4), T(7, 2)) == (3, 7)


# ------------------------------------------------------ one test per class of bad input


BAD = {
    "bool flag": (
        lambda: check_bool("is_causal", "no"),
        TypeError,
        "is_causal must be a bool .* got str 'no'",
    ),
    "int is not bool": (
        lambda: check_int("n", True),
        TypeError,
        "n must be an int, got bool",
    ),
    "int minimum": (
        lambda: check_int("n", -1, minimum=0),
        ValueError,
        "n must be >= 0, got -1",
    ),
    "size": (
        lambda: check_size("block_size", 0),
        ValueError,
        "block_size must be >= 1, got 0",
    ),
    "size float": (
        lambda: check_size("block_size", 2.0),
        TypeError,
        "block_size must be an int",
    ),
    "scale bool": (
        lambda: check_scale(True),
        TypeError,
        "scale must be a float or None, got bool",
    ),
    "scale tensor": (lambda: check_scale(torch.tensor(1.0)), TypeError, "got Tensor"),
    "probability": (
        lambda: check_probability("dropout_p", 1.5),
        ValueError,
        r"dropout_p must lie in \[0, 1\), got 1.5",
    ),
    "choice": (
        lambda: check_choice("side", "up", ("right", "left")),
        ValueError,
        "side must be one of 'right', 'left', got 'up'",
    ),
    "dim type": (lambda: check_dim("dim", 1.0, 3), TypeError, "dim must be an int"),
    "dim range": (
        lambda: check_dim("dim", 3, 3),
        ValueError,
        r"dim must lie in \[-3, 2\] for a tensor with 3 dimensions, got 3",
    ),
    "dtype": (
        lambda: check_dtype("dtype", "float32"),
        TypeError,
        "dtype must be a torch.dtype",
    ),
    "dtype floating": (
        lambda: check_dtype("dtype", torch.int32, floating=True),
        TypeError,
        "floating-point dtype, got torch.int32",
    ),
    "device type": (
        lambda: check_device("device", 1.5),
        TypeError,
        "device must be a torch.device",
    ),
    "device value": (
        lambda: check_device("device", "gpu7"),
        ValueError,
        "not a valid device",
    ),
    "generator": (
        lambda: check_generator(0),
        TypeError,
        "generator must be a torch.Generator or None, got int",
    ),
    "same device": (
        lambda: check_same_device(query=T(2), key=T(2).to("meta")),
        ValueError,
        "query and key must be on the same device, got cpu and meta",
    ),
    "like dtype": (
        lambda: check_like(
            "x", T(2), "the module's parameters", T(2, dtype=torch.float32)
        ),
        TypeError,
        r"x must have the dtype of the module's parameters \(torch.float32\), "
        "got torch.float64",
    ),
    "qkv not tensor": (
        lambda: check_qkv([1.0], T(2, 2)),
        TypeError,
        "query must be a torch.Tensor, got list",
    ),
    "qkv integer": (
        lambda: check_qkv(T(2, 2, dtype=torch.long), T(2, 2)),
        TypeError,
        "query must have a floating-point dtype",
    ),
    "qkv d": (
        lambda: check_qkv(T(3, 24), T(4, 16), T(4, 2)),
        ValueError,
        "query and key must share their last dimension d, got 24 and 16",
    ),
    "qkv j": (
        lambda: check_qkv(T(3, 4), T(4, 4), T(5, 2)),
        ValueError,
        "key and value must have the same number of positions j, got 4 and 5",
    ),
    "value None": (
        lambda: validate_attention(T(3, 4), T(3, 4), None),
        TypeError,
        "value must be a torch.Tensor, got NoneType",
    ),
    "real too large for a float": (
        lambda: check_scale(10**400),
        ValueError,
        r"scale must be a number a float can hold \(magnitude at most 1.798e\+308\), "
        "got int of about 1e400",
    ),
    "positive too large for a float": (
        lambda: check_positive("base", -(10**400)),
        ValueError,
        "base must be a number a float can hold .* got int of about 1e400",
    ),
    "factory dtype": (
        lambda: check_factory(None, "float32"),
        TypeError,
        "dtype must be a torch.dtype, got str 'float32'",
    ),
    "factory integer dtype": (
        lambda: check_factory(None, torch.int64),
        TypeError,
        "dtype must be a floating-point dtype, got torch.int64",
    ),
    "factory device": (
        lambda: check_factory("gpu7", None),
        ValueError,
        "device is not a valid device: 'gpu7'",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input(name):
    call, exc, match = BAD[name]
    with pytest.raises(exc, match=match):
        call()


def test_checks_return_the_clean_value():
    assert (
        check_size("w", 10**6) == 10**6
    )  # clamping to the sequence is the caller's job
    assert check_scale(None) is None and check_scale(2) == 2.0
    assert check_dim("dim", -1, 3) == 2
    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_probability("p", 0) == 0.0
    assert check_real("x", 10**308) == 1e308  # large ints that a float holds pass
    assert check_factory("cpu", torch.float64) == {
        "device": torch.device("cpu"),
        "dtype": torch.float64,
    }
    assert check_factory(None, None) == {"device": None, "dtype": None}


def test_nan_scale_is_allowed_and_propagates_as_in_torch():
    q = torch.randn(2, 3, dtype=f64)
    assert _checks.check_scale(float("nan")) != _checks.check_scale(float("nan"))
    out = scaled_dot_product.scaled_dot_product_attention(q, q, q, scale=float("nan"))
    assert (
        out.isnan().all()
        and F.scaled_dot_product_attention(q, q, q, scale=float("nan")).isnan().all()
    )


def test_setup_notebook_checks_everything_before_touching_global_state():
    from attention import setup_notebook

    threads, state = torch.get_num_threads(), torch.get_rng_state()
    for kwargs, exc in (
        ({"threads": 0}, ValueError),
        ({"seed": -1}, ValueError),
        ({"precision": 2.5}, TypeError),
        ({"seed": True}, TypeError),
    ):
        with pytest.raises(exc):
            setup_notebook(**{"seed": 3, **kwargs})
        assert torch.get_num_threads() == threads and torch.equal(
            torch.get_rng_state(), state
        )
