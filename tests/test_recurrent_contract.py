"""One suite for the recurrent family: the kernels that carry a state across a sequence.

``f(query, key, value, <own inputs>, *, scale=None, initial_state=None,
output_final_state=False, <chunk option>)`` with query/key ``(b, h, n, d)``, value
``(b, h, n, e)`` and a state ``(b, h, d, e)``. The chunk option is ``chunk_size``
(``None`` runs the token-by-token recurrence) or, for Lightning, ``block_size``. Every
kernel is listed once; every test runs over all of them: the same validation messages
for the state and the chunk option, ``(out, state)`` with ``output_final_state``, state
chaining, the chunked form equal to the recurrence, rows that see only what the
recurrence has seen (a NaN key or value at ``p`` reaches rows ``>= p`` only), a chunk
far longer than the sequence (cut to it, nothing allocated beyond it), half precision
and the empty sequence. (Each kernel's own maths is tested in its own file.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from attention import (
    delta_rule_attention,
    gated_delta_rule_attention,
    kimi_delta_attention,
    lightning_attention,
)

F64 = torch.float64
B, H, D, E = 2, 2, 4, 3


@dataclass
class Recurrent:
    name: str
    call: object  # (q, k, v, inputs, **options) -> output or (output, state)
    inputs: object  # (n, generator) -> the kernel's own inputs, positions on dim 2
    chunk: str = "chunk_size"  # the name of the chunk option
    # the value of the chunk option that runs the recurrence token by token
    token_by_token: object = None


def _beta(n, gen):
    return torch.rand(B, H, n, generator=gen, dtype=F64)


def _log_decay(*shape, gen):
    return -torch.rand(*shape, generator=gen, dtype=F64)


KERNELS = [
    Recurrent(
        "delta_rule_attention",
        lambda q, k, v, x, **kw: delta_rule_attention(q, k, v, x["beta"], **kw),
        lambda n, gen: {"beta": _beta(n, gen)},
    ),
    Recurrent(
        "gated_delta_rule_attention",
        lambda q, k, v, x, **kw: gated_delta_rule_attention(
            q, k, v, x["beta"], x["g"], **kw
        ),
        lambda n, gen: {"beta": _beta(n, gen), "g": _log_decay(B, H, n, gen=gen)},
    ),
    Recurrent(
        "kimi_delta_attention",
        lambda q, k, v, x, **kw: kimi_delta_attention(q, k, v, x["g"], x["beta"], **kw),
        lambda n, gen: {"beta": _beta(n, gen), "g": _log_decay(B, H, n, D, gen=gen)},
    ),
    # one log-decay per head, the same at every position: nothing to cut along n
    Recurrent(
        "lightning_attention",
        lambda q, k, v, x, **kw: lightning_attention(q, k, v, decay=x["decay"], **kw),
        lambda n, gen: {"decay": torch.tensor([-0.1, -0.5], dtype=F64)},
        chunk="block_size",
        token_by_token=1,
    ),
]


def _kernels():
    return [pytest.param(kernel, id=kernel.name) for kernel in KERNELS]


def _inputs(kernel, n=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=gen, dtype=F64)
    k = torch.nn.functional.normalize(
        torch.randn(B, H, n, D, generator=gen, dtype=F64), dim=-1
    )
    v = torch.randn(B, H, n, E, generator=gen, dtype=F64)
    s0 = torch.randn(B, H, D, E, generator=gen, dtype=F64)
    return q, k, v, kernel.inputs(n, gen), s0


def _cut(x, start, stop):
    """Positions ``start:stop`` of the per-position inputs (dim 2), the rest as is."""
    return {name: t[:, :, start:stop] if t.dim() >= 3 else t for name, t in x.items()}


def _chunked(kernel, size):
    return {kernel.chunk: size}


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kernel", _kernels())
def test_the_same_messages_for_a_bad_initial_state(kernel):
    q, k, v, x, s0 = _inputs(kernel)
    cases = [
        (
            s0[..., :3, :],
            ValueError,
            r"initial_state must have shape \(\.\.\., d, e\) = \(2, 2, 4, 3\), "
            r"got \(2, 2, 3, 3\)",
        ),
        (
            s0[0],
            ValueError,
            r"initial_state must have shape \(\.\.\., d, e\) = \(2, 2, 4, 3\)",
        ),
        (
            s0.float(),
            TypeError,
            "query and initial_state must share a dtype, got torch.float64 and "
            "torch.float32",
        ),
        (
            s0.to("meta"),
            ValueError,
            "query and initial_state must be on the same device, got cpu and meta",
        ),
        (s0.tolist(), TypeError, "initial_state must be a torch.Tensor, got list"),
        (
            s0.long(),
            TypeError,
            "initial_state must have a floating-point dtype, got torch.int64",
        ),
        (s0[0, 0, 0], ValueError, "initial_state must have at least 2 dimensions"),
    ]
    for state, error, message in cases:
        with pytest.raises(error, match=message):
            kernel.call(q, k, v, x, initial_state=state)


@pytest.mark.parametrize("kernel", _kernels())
def test_the_same_messages_for_a_bad_chunk_option_and_output_final_state(kernel):
    q, k, v, x, _ = _inputs(kernel)
    name = kernel.chunk
    with pytest.raises(ValueError, match=f"{name} must be >= 1, got 0"):
        kernel.call(q, k, v, x, **_chunked(kernel, 0))
    with pytest.raises(TypeError, match=f"{name} must be an int, got float 2.5"):
        kernel.call(q, k, v, x, **_chunked(kernel, 2.5))
    with pytest.raises(TypeError, match=f"{name} must be an int, got bool True"):
        kernel.call(q, k, v, x, **_chunked(kernel, True))
    with pytest.raises(TypeError, match="output_final_state must be a bool"):
        kernel.call(q, k, v, x, output_final_state=1)


# ---------------------------------------------------------------------------- results


@pytest.mark.parametrize("kernel", _kernels())
def test_output_final_state_returns_the_output_and_the_state(kernel):
    q, k, v, x, s0 = _inputs(kernel)
    alone = kernel.call(q, k, v, x, initial_state=s0, **_chunked(kernel, 4))
    assert isinstance(alone, torch.Tensor) and alone.shape == (B, H, 9, E)
    out, state = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **_chunked(kernel, 4)
    )
    assert state.shape == (B, H, D, E) and state.dtype == F64
    torch.testing.assert_close(out, alone)


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("size", [1, 3, 4, 9, 100])
def test_the_chunked_form_equals_the_recurrence(kernel, size):
    q, k, v, x, s0 = _inputs(kernel)
    ref, ref_state = kernel.call(
        q,
        k,
        v,
        x,
        initial_state=s0,
        output_final_state=True,
        **_chunked(kernel, kernel.token_by_token),
    )
    out, state = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **_chunked(kernel, size)
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("chunked", [False, True])
def test_two_halves_chained_through_the_state_give_the_whole(kernel, chunked):
    q, k, v, x, s0 = _inputs(kernel, n=11)
    opts = _chunked(kernel, 3 if chunked else kernel.token_by_token)
    whole, final = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **opts
    )
    first, mid = kernel.call(
        q[..., :5, :],
        k[..., :5, :],
        v[..., :5, :],
        _cut(x, 0, 5),
        initial_state=s0,
        output_final_state=True,
        **opts,
    )
    second, end = kernel.call(
        q[..., 5:, :],
        k[..., 5:, :],
        v[..., 5:, :],
        _cut(x, 5, 11),
        initial_state=mid,
        output_final_state=True,
        **opts,
    )
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(end, final)


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("size", [None, 3, 4])
@pytest.mark.parametrize("where", ["key", "value"])
def test_a_nan_key_or_value_reaches_only_the_rows_after_it(kernel, size, where):
    """A NaN at position 5 in the middle of the chunk [3, 4, 5] (size 3) or [4 .. 7]
    (size 4): rows 0-4 are what they were without it, rows 5-8 are NaN."""
    q, k, v, x, s0 = _inputs(kernel)
    opts = _chunked(kernel, kernel.token_by_token if size is None else size)
    clean = kernel.call(q, k, v, x, initial_state=s0, **opts)
    k, v = k.clone(), v.clone()
    (k if where == "key" else v)[0, 1, 5] = math.nan
    out = kernel.call(q, k, v, x, initial_state=s0, **opts)
    torch.testing.assert_close(out[..., :5, :], clean[..., :5, :])
    assert out[0, 1, 5:].isnan().all()
    torch.testing.assert_close(out[:, 0], clean[:, 0])  # another head: untouched
    torch.testing.assert_close(out[1], clean[1])  # another sequence of the batch


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("size", [None, 3])
def test_a_nan_query_reaches_its_own_row_only(kernel, size):
    q, k, v, x, s0 = _inputs(kernel)
    opts = _chunked(kernel, kernel.token_by_token if size is None else size)
    clean = kernel.call(q, k, v, x, initial_state=s0, **opts)
    q = q.clone()
    q[0, 1, 4, 0] = math.nan
    out = kernel.call(q, k, v, x, initial_state=s0, **opts)
    assert out[0, 1, 4].isnan().all()
    rest = torch.ones(out.shape[:-1], dtype=torch.bool)
    rest[0, 1, 4] = False
    torch.testing.assert_close(out[rest], clean[rest])


@pytest.mark.parametrize("kernel", _kernels())
def test_a_chunk_far_longer_than_the_sequence_is_cut_to_it(kernel):
    # an uncut chunk of 2**40 positions would ask for (2**40, 2**40) tiles and fail
    q, k, v, x, s0 = _inputs(kernel, n=7)
    huge, huge_state = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **_chunked(kernel, 2**40)
    )
    whole, whole_state = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **_chunked(kernel, 7)
    )
    torch.testing.assert_close(huge, whole, rtol=0, atol=0)
    torch.testing.assert_close(huge_state, whole_state, rtol=0, atol=0)


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [None, 3])
def test_half_precision_keeps_its_dtype_and_is_close_to_float64(kernel, dtype, size):
    """The delta rules compute half precision in float32 (CPU torch has no half
    triangular solve) and return the input dtype; Lightning computes in it."""
    q, k, v, x, s0 = _inputs(kernel)
    opts = _chunked(kernel, kernel.token_by_token if size is None else size)
    half = [t.to(dtype) for t in (q, k, v, s0)]
    half_x = {name: t.to(dtype) for name, t in x.items()}
    out, state = kernel.call(
        *half[:3], half_x, initial_state=half[3], output_final_state=True, **opts
    )
    assert out.dtype == state.dtype == dtype
    # the reference takes the same (rounded) inputs, so only the arithmetic differs
    exact, exact_state = kernel.call(
        *(t.double() for t in half[:3]),
        {name: t.double() for name, t in half_x.items()},
        initial_state=half[3].double(),
        output_final_state=True,
        **opts,
    )
    tol = (
        {"rtol": 2e-2, "atol": 2e-2}
        if dtype == torch.bfloat16
        else {"rtol": 4e-3, "atol": 4e-3}
    )
    torch.testing.assert_close(out.double(), exact, **tol)
    torch.testing.assert_close(state.double(), exact_state, **tol)


@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("size", [None, 3])
def test_an_empty_sequence_returns_no_rows_and_the_initial_state(kernel, size):
    q, k, v, x, s0 = _inputs(kernel, n=0)
    opts = _chunked(kernel, kernel.token_by_token if size is None else size)
    out, state = kernel.call(
        q, k, v, x, initial_state=s0, output_final_state=True, **opts
    )
    assert out.shape == (B, H, 0, E)
    torch.testing.assert_close(state, s0, rtol=0, atol=0)
