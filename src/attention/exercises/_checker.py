"""The engine behind every exercise checker, and the inputs the checkers share.

A checker (``check_softmax`` in ``ch02.py``, one per exercise) hands :func:`check` the
reader's function, a reference and a few named inputs, the *cases*. :func:`check` runs
both on every case and either prints one line starting with ``✓`` or raises an
:class:`ExerciseError` whose message is one line saying what is wrong and where:

- the function is still a stub (it raises ``NotImplementedError``);
- it raised (the exception, the line of the reader's code, the case);
- it returned the wrong kind of object, shape or dtype (got and expected, the case);
- it returned NaN or inf where the answer is finite (the index, the case's hint);
- it matches a known mistake (a wrong implementation the checker registered, with a
  hint such as "the mask looks inverted: True must mean may attend");
- it breaks a rule that must hold ("rows must sum to 1", "masked weights must be
  exactly 0": :class:`Property`);
- its values differ (the first differing index, got and expected, the tolerance);
- it changed its input in place.

The cases are where the traps live: scores near 1000 (overflow without the max shift),
masks with True and False in every row (inverted polarity), ``i != j`` and ``d != e``
(a transposed K raises, a mixed-up value shows), ``d > 1`` (a missing ``1/sqrt(d)``), a
causal mask with more than one row (an off-by-one diagonal). The builders at the end of
this module make such inputs, seeded and in float64.

Inside IPython (Jupyter, Colab) the error shows as its one line, with no traceback
(:meth:`ExerciseError._render_traceback_`); the engine's frames also set
``__tracebackhide__``, which pytest honours. The reader's inputs are never touched: each
call gets fresh clones of the case's tensors.

Writing a checker::

    def check_softmax(fn):
        __tracebackhide__ = True
        check(fn, softmax, [Case("3 rows of 5 scores", (randn(3, 5),)), ...],
              what="softmax along dim", mistakes=[Mistake(hint, wrong_softmax)])

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``d`` query/key size, ``e`` value size. Mask convention: boolean, **True = may attend**,
as in ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import inspect
import linecache
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ExerciseError",
    "Case",
    "Property",
    "Mistake",
    "check",
    "generator",
    "randn",
    "random_qkv",
    "random_mask",
]

#: Tolerances of :func:`check` unless a checker states others: float64 inputs, so any
#: correct formula lands far within them, and any wrong one far outside.
ATOL = 1e-10
RTOL = 0.0

STUB_MESSAGE = (
    "{name} is still a stub: replace `raise NotImplementedError` with your code"
)
_NONFINITE_HINT = "an exp overflowed, or 0/0 or inf - inf happened on the way"
_MAX_ERROR_TEXT = 160  # characters of a reader's exception message quoted in the line


class ExerciseError(AssertionError):
    """A reader's function failed an exercise check; the message is one line.

    An ``AssertionError``, so a test runner counts it as a failed check. IPython shows
    it as that one line with no traceback (see :meth:`_render_traceback_`).
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython prints for this exception: its name and message, no frames."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


@dataclass(frozen=True)
class Case:
    """One named input of a checker.

    Attributes:
        name: what the input is, as the reader should see it ("large scores (about
            1000)"); the failure message quotes it.
        args, kwargs: the arguments of one call (tensors are cloned for every call).
        hint: said when the reader's result is NaN or inf where the answer is finite
            ("exp(1000) overflows: subtract the maximum first").
        also_accept: another function of the same arguments whose answer is accepted
            as well (e.g. zeros instead of NaN for a row that is entirely ``-inf``).
    """

    name: str
    args: tuple = ()
    kwargs: Mapping = field(default_factory=dict)
    hint: str = ""
    also_accept: Callable | None = None


@dataclass(frozen=True)
class Property:
    """A rule the reader's output must obey on every case, checked even when close.

    Attributes:
        rule: the rule in the words of the failure message ("each row must sum to 1").
        holds: ``holds(output, *args, **kwargs)`` for a case's arguments: a boolean
            tensor, True where the rule holds (the message names the first index where
            it does not), or a bool.
    """

    rule: str
    holds: Callable


@dataclass(frozen=True)
class Mistake:
    """A typical wrong implementation, so the failure message can name the fault.

    When the reader's output on a failing case equals this function's output (within
    the tolerance, NaN matching NaN), or both raise the same exception with the same
    message, the message gives ``hint`` instead of a bare difference.

    Attributes:
        hint: what seems wrong and how to fix it, e.g. "the mask looks inverted: True
            must mean may attend".
        fn: the wrong implementation, with the signature of the exercise.
    """

    hint: str
    fn: Callable


@dataclass(frozen=True)
class _Raised:
    """An exception raised by a call, kept as a value."""

    error: Exception


# --------------------------------------------------------------------------- check


def check(
    fn,
    reference: Callable,
    cases: Sequence[Case],
    *,
    what: str,
    outputs: Sequence[str] | None = None,
    properties: Sequence[Property] = (),
    mistakes: Sequence[Mistake] = (),
    atol: float = ATOL,
    rtol: float = RTOL,
    checker: str | None = None,
) -> None:
    """Run ``fn`` and ``reference`` on every case; print ``✓ ...`` or raise one line.

    The result must have the reference's structure: one tensor, a tuple of tensors (name
    them with ``outputs``) or a number. Floating results agree when
    ``|got - expected| <= atol + rtol * |expected|`` (NaN matches NaN, inf the same
    inf); boolean and integer results must be equal. The first failing case stops the
    check.

    Args:
        fn: the reader's function.
        reference: the correct function, same signature.
        cases: the inputs, most basic first (the first failure is the one reported).
        what: what a pass means, for the ``✓`` line ("softmax along any dim").
        outputs: names of the elements when the reference returns a tuple ("m", "l").
        properties: rules the output must obey on every case.
        mistakes: known wrong implementations, tried when a case fails.
        atol, rtol: the tolerance of floating results.
        checker: the checker's name for the message when ``fn`` is not a function
            (default: the caller's name).

    Raises:
        ExerciseError: one line naming the fault, the case and where.
    """
    __tracebackhide__ = True
    checker = checker or sys._getframe(1).f_code.co_name
    floating: list[bool] = []  # per compared result: was it floating-point?
    problem = _problem(
        fn,
        reference,
        cases,
        outputs,
        properties,
        mistakes,
        atol,
        rtol,
        checker,
        floating,
    )
    if problem is not None:
        raise ExerciseError(problem)
    exact = (atol == 0 and rtol == 0) or not any(floating)
    tolerance = "exactly" if exact else f"within {_tolerance(atol, rtol)}"
    inputs = "1 input" if len(cases) == 1 else f"{len(cases)} inputs"
    print(f"✓ {_name(fn)}: {what} ({inputs}, {tolerance})")


def _problem(
    fn, reference, cases, outputs, properties, mistakes, atol, rtol, checker, floating
):
    """The one-line description of the first failure, or None when every case passes.

    Appends to ``floating`` whether each compared result was floating-point.
    """
    __tracebackhide__ = True
    if not callable(fn):
        return (
            f"{checker} needs your function itself, got {_kind(fn)}: pass its name, "
            f"{checker}(my_function), not {checker}(my_function(x))"
        )
    if not cases:
        raise ValueError("a checker needs at least one case")
    name = _name(fn)
    names = _argument_names(reference)
    for case in cases:
        expected = _call(reference, case)
        if isinstance(expected, _Raised):  # the checker's own fault: let it show
            raise expected.error
        got, args, kwargs = _call_with_inputs(fn, case)
        if isinstance(got, _Raised):
            return _raised(fn, name, got.error, case, mistakes)
        parts = _structure(got, expected, outputs, name, case)
        if isinstance(parts, str):
            return _with_mistake(parts, got, case, expected, mistakes, atol, rtol)
        floating += [p.expected.is_floating_point() for p in parts]
        accepted = [parts]
        if case.also_accept is not None:
            other = _structure(got, _call(case.also_accept, case), outputs, name, case)
            accepted += [] if isinstance(other, str) else [other]
        if not any(_matches(p, atol, rtol) for p in accepted):
            mistake = _mistake(got, case, expected, mistakes, atol, rtol)
            if mistake is not None:
                return f"{name}: {mistake.hint} ({_evidence(parts, case, atol, rtol)})"
            for problem in (
                _nonfinite(parts, name, case),
                _broken(properties, got, case, name),
            ):
                if problem is not None:
                    return problem
            return _difference(parts, name, case, atol, rtol)
        problem = _broken(properties, got, case, name) or _mutated(
            args, kwargs, case, names, name
        )
        if problem is not None:
            return problem
    return None


# --------------------------------------------------------------------------- calling


def _clone(obj: Any) -> Any:
    """``obj`` with every tensor in it copied (tuples, lists and dicts walked)."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, (tuple, list)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _call(fn, case: Case):
    """``fn`` on fresh clones of the case's arguments; an exception is returned."""
    return _call_with_inputs(fn, case)[0]


def _call_with_inputs(fn, case: Case):
    """``(result or _Raised, args, kwargs)``, the clones given, to find changes."""
    args, kwargs = _clone(tuple(case.args)), _clone(dict(case.kwargs))
    try:
        out = fn(*args, **kwargs)
    except Exception as err:  # the reader's code may raise anything: it is reported
        return _Raised(err), args, kwargs
    return out, args, kwargs


def _name(fn) -> str:
    """The reader's name for the function (``my_softmax``), or "your function"."""
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else "your function"


def _argument_names(fn) -> list[str]:
    """The reference's positional parameters, to name an input changed in place."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


# --------------------------------------------------------------------------- exceptions


def _innermost(err: Exception):
    """The frame where ``err`` was raised (the last one of its traceback), or None."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _reader_line(fn, err: Exception) -> str | None:
    """The source line of the reader's function (or of a function it calls from the same
    file) that was running when ``err`` was raised."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    line = None
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == code.co_filename:
            line = linecache.getline(code.co_filename, tb.tb_lineno).strip() or line
        tb = tb.tb_next
    return line


def _raised(fn, name: str, err: Exception, case: Case, mistakes) -> str:
    """The line for a call that raised: a stub, or the exception and where."""
    if isinstance(err, NotImplementedError):
        tb = _innermost(err)
        if tb is not None:
            code = tb.tb_frame.f_code
            source = linecache.getline(code.co_filename, tb.tb_lineno)
            # a stub's own `raise` (or a line whose source is unknown), not a torch op
            # that is not implemented, which raises from the reader's calling line
            if "NotImplementedError" in source or not source.strip():
                if code is getattr(fn, "__code__", code):
                    return STUB_MESSAGE.format(name=name)
                return (
                    f"{name} calls {code.co_name}, which "
                    + STUB_MESSAGE.format(name="")[1:]
                )
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if len(text) > _MAX_ERROR_TEXT:
        text = text[: _MAX_ERROR_TEXT - 3] + "..."
    line = _reader_line(fn, err)
    where = f" at `{line}`" if line and len(line) <= 80 else ""
    message = (
        f"{name} raised {type(err).__name__}: {text}{where}, on case '{case.name}'"
    )
    for mistake in mistakes:
        theirs = _call(mistake.fn, case)
        if (
            isinstance(theirs, _Raised)
            and type(theirs.error) is type(err)
            and str(theirs.error) == str(err)
        ):
            return f"{message}; {mistake.hint}"
    return message


# --------------------------------------------------------------------------- structure


@dataclass(frozen=True)
class _Part:
    """One compared element of a result: its label ("" or "l "), got and expected."""

    label: str
    got: Tensor
    expected: Tensor


def _kind(x) -> str:
    """What the reader passed or returned: "a Tensor", "a tuple of 3", "an int"..."""
    if x is None:
        return "None"
    if isinstance(x, Tensor):
        return "a Tensor"
    kind = type(x).__name__
    if isinstance(x, (tuple, list)):
        kind = f"{kind} of {len(x)}"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _structure(got, expected, outputs, name: str, case: Case):
    """The parts to compare, or the line saying the result has the wrong structure."""
    where = f"on case '{case.name}'"
    if got is None and expected is not None:
        return f"{name} returned None {where}: did you forget `return`?"
    if isinstance(expected, tuple):
        labels = (
            list(outputs) if outputs else [f"output {k}" for k in range(len(expected))]
        )
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            want = f"a tuple of {len(expected)} ({', '.join(labels)})"
            return f"{name} returned {_kind(got)} {where}, expected {want}"
        pairs = [(f"{lab} ", g, e) for lab, g, e in zip(labels, got, expected)]
    else:
        pairs = [("", got, expected)]
    parts = []
    for label, g, e in pairs:
        part = _part(label, g, e, name, where)
        if isinstance(part, str):
            return part
        parts.append(part)
    return parts


def _part(label: str, got, expected, name: str, where: str):
    """One element compared: a tensor against a tensor, or a number against a number."""
    if isinstance(expected, (bool, int, float)):
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (bool, int, float)):
            what = f"{label}as {_kind(got)}" if label else _kind(got)
            return f"{name} returned {what} {where}, expected a number"
        dtype = torch.bool if isinstance(expected, bool) else torch.float64
        return _Part(
            label, torch.tensor(got, dtype=dtype), torch.tensor(expected, dtype=dtype)
        )
    if not isinstance(got, Tensor):
        what = f"{label}as {_kind(got)}" if label else _kind(got)
        return f"{name} returned {what} {where}, expected a torch.Tensor"
    shown = label or "a tensor "
    if got.shape != expected.shape:
        return (
            f"{name} returned {shown}with shape {tuple(got.shape)} {where}, "
            f"expected {tuple(expected.shape)}"
        )
    if got.dtype != expected.dtype:
        hint = ""
        if expected.dtype == torch.bool:
            hint = (
                ": a mask is a bool tensor (True = may attend); build it by comparing"
            )
        elif expected.is_floating_point():
            hint = ": make new tensors with the input's dtype (dtype=x.dtype)"
        return (
            f"{name} returned {shown}with dtype {got.dtype} {where}, "
            f"expected {expected.dtype}{hint}"
        )
    return _Part(label, got.detach().cpu(), expected.detach().cpu())


# --------------------------------------------------------------------------- values


def _close(got: Tensor, expected: Tensor, atol: float, rtol: float) -> Tensor:
    """Elementwise agreement: within the tolerance, NaN with NaN, inf with its twin."""
    if not (got.is_floating_point() or expected.is_floating_point()):
        return got == expected
    g, e = got.to(torch.float64), expected.to(torch.float64)
    same = (g == e) | (g.isnan() & e.isnan())
    return same | ((g - e).abs() <= atol + rtol * e.abs())


def _matches(parts, atol: float, rtol: float) -> bool:
    return all(bool(_close(p.got, p.expected, atol, rtol).all()) for p in parts)


def _first(bad: Tensor) -> tuple[int, ...] | None:
    """Index of the first True entry of ``bad`` in reading order, or None."""
    flat = bad.reshape(-1).nonzero()
    if flat.numel() == 0:
        return None
    rest, index = int(flat[0, 0]), []
    for size in reversed(bad.shape):
        index.append(rest % size)
        rest //= size
    return tuple(reversed(index))


def _at(index: tuple[int, ...]) -> str:
    return f" at index {index}" if index else ""


def _number(x: Tensor) -> str:
    v = x.item()
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    return f"{v:.6g}" if math.isfinite(v) else str(v)


def _pair(got: Tensor, expected: Tensor) -> tuple[str, str]:
    """Two numbers printed so that their difference shows (more digits when needed)."""
    g, e = _number(got), _number(expected)
    if g == e:
        g, e = repr(got.item()), repr(expected.item())
    return g, e


def _tolerance(atol: float, rtol: float) -> str:
    if rtol == 0:
        return f"{atol:g}"
    return f"{atol:g} + {rtol:g}·|expected|"


def _nonfinite(parts, name: str, case: Case) -> str | None:
    """NaN or inf where the answer is finite: the index and the case's hint."""
    for p in parts:
        if not p.got.is_floating_point():
            continue
        index = _first(~p.got.isfinite() & p.expected.to(torch.float64).isfinite())
        if index is not None:
            g, e = _pair(p.got[index], p.expected[index])
            hint = case.hint or _NONFINITE_HINT
            return (
                f"{name} returned {p.label}{g}{_at(index)} on case '{case.name}', "
                f"where the answer is {e}: {hint}"
            )
    return None


def _difference(parts, name: str, case: Case, atol: float, rtol: float) -> str:
    """The first differing value: index, got, expected, tolerance."""
    for p in parts:
        index = _first(~_close(p.got, p.expected, atol, rtol))
        if index is None:
            continue
        g, e = _pair(p.got[index], p.expected[index])
        label = f" in {p.label.strip()}" if p.label else ""
        tol = (
            ""
            if not p.got.is_floating_point()
            else f" (tolerance {_tolerance(atol, rtol)})"
        )
        return (
            f"{name} is wrong{label}{_at(index)} on case '{case.name}': "
            f"got {g}, expected {e}{tol}"
        )
    raise AssertionError(
        "no differing value found"
    )  # pragma: no cover - callers ensure one


def _evidence(parts, case: Case, atol: float, rtol: float) -> str:
    """Case, first differing index and values, for a message that names a mistake."""
    for p in parts:
        index = _first(~_close(p.got, p.expected, atol, rtol))
        if index is not None:
            g, e = _pair(p.got[index], p.expected[index])
            label = f"{p.label.strip()} " if p.label else ""
            return f"case '{case.name}': {label}got {g}{_at(index)}, expected {e}"
    return (
        f"case '{case.name}'"  # pragma: no cover - a mistake is tried only on a failure
    )


def _broken(properties, got, case: Case, name: str) -> str | None:
    """The first rule the output breaks on this case, and the first index it fails."""
    for prop in properties:
        ok = prop.holds(got, *case.args, **case.kwargs)
        if isinstance(ok, Tensor):
            index = _first(~ok.to(torch.bool))
            if index is None:
                continue
            where = f" (it fails{_at(index)})" if index else ""
        elif bool(ok):
            continue
        else:
            where = ""
        return f"{name} breaks a rule on case '{case.name}': {prop.rule}{where}"
    return None


def _mutated(args, kwargs, case: Case, names, name: str) -> str | None:
    """The first input tensor the reader's function changed in place."""
    given = list(zip(names, args)) + list(kwargs.items())
    original = list(zip(names, case.args)) + list(case.kwargs.items())
    for (arg, after), (_, before) in zip(given, original):
        if not isinstance(before, Tensor):
            continue
        if after.shape != before.shape or not bool(
            _close(after, before, 0.0, 0.0).all()
        ):
            return (
                f"{name} changed its input {arg} in place on case '{case.name}': "
                f"work on a new tensor (x = x - m, not x -= m)"
            )
    return None


# --------------------------------------------------------------------------- mistakes


def _mistake(got, case: Case, expected, mistakes, atol: float, rtol: float):
    """The registered mistake whose output on this case is the reader's, or None."""
    for mistake in mistakes:
        theirs = _call(mistake.fn, case)
        if isinstance(theirs, _Raised):
            continue
        parts = _structure(got, theirs, None, "", case)
        if isinstance(parts, str) or not _matches(parts, atol, rtol):
            continue
        against = _structure(theirs, expected, None, "", case)
        if isinstance(against, str) or not _matches(against, atol, rtol):
            # the reader's output is the mistake's, and the mistake is wrong here
            return mistake
    return None


def _with_mistake(problem: str, got, case: Case, expected, mistakes, atol, rtol) -> str:
    """A problem of type, shape or dtype, with a mistake's hint when one matches."""
    mistake = _mistake(got, case, expected, mistakes, atol, rtol)
    return problem if mistake is None else f"{problem}; {mistake.hint}"


# --------------------------------------------------------------------------- inputs


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: every case is the same on every run."""
    return torch.Generator().manual_seed(seed)


def randn(
    *shape: int, seed: int = 0, scale: float = 1.0, dtype=torch.float64
) -> Tensor:
    """Standard normal numbers of ``shape`` times ``scale`` (float64 unless told).

    ``scale=1000`` gives scores whose ``exp`` overflows without the max shift.

    Example:
        >>> randn(2, 3).shape, randn(2, 3).dtype
        (torch.Size([2, 3]), torch.float64)
        >>> torch.equal(randn(4, seed=1), randn(4, seed=1))
        True
    """
    return scale * torch.randn(*shape, generator=generator(seed), dtype=dtype)


def random_qkv(
    i: int = 3,
    j: int = 5,
    *,
    d: int = 4,
    e: int = 2,
    batch: tuple[int, ...] = (),
    seed: int = 0,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random query ``(*batch, i, d)``, key ``(*batch, j, d)``, value ``(..., j, e)``.

    Drawn in that order from one seeded generator, in float64. The default sizes all
    differ (``i = 3, j = 5, d = 4, e = 2``), so a transposed key or a value used in the
    key's place raises or shows, and ``d > 1`` makes a missing ``1/sqrt(d)`` visible.
    ``scale`` multiplies the queries and keys (large scores).

    Example:
        >>> q, k, v = random_qkv(batch=(2,))
        >>> tuple(q.shape), tuple(k.shape), tuple(v.shape)
        ((2, 3, 4), (2, 5, 4), (2, 5, 2))
    """
    g = generator(seed)
    q = scale * torch.randn(*batch, i, d, generator=g, dtype=torch.float64)
    k = scale * torch.randn(*batch, j, d, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, j, e, generator=g, dtype=torch.float64)
    return q, k, v


def random_mask(*shape: int, seed: int = 0, p: float = 0.5) -> Tensor:
    """A boolean mask (True = may attend) with True and False in every row.

    Each entry is True with probability ``p``; then every row (the last axis, at least 2
    long) gets one True and one False at random places if it lacked them. So no query is
    left with nothing to attend to, and an inverted mask differs in every row.

    Example:
        >>> m = random_mask(4, 6)
        >>> bool(m.any(-1).all()), bool((~m).any(-1).all())
        (True, True)
    """
    if len(shape) == 0 or shape[-1] < 2:
        raise ValueError(f"a mask needs rows of at least 2 keys, got shape {shape}")
    g = generator(seed)
    mask = torch.rand(*shape, generator=g) < p
    rows = mask.reshape(-1, shape[-1])
    for row in rows:
        where = torch.randperm(shape[-1], generator=g)[:2]
        if not row.any():
            row[where[0]] = True
        if row.all():
            row[where[1]] = False
    return rows.reshape(shape)
