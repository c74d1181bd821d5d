"""The exercise engine, attention/exercises/_checker.py: one line naming each failure.

Each test gives :func:`check` a reader's function that fails in one way and asserts the
one-line message. The last tests build a small attention checker and a causal-mask
checker, models for the chapters' own, and show that the engine names the classic traps:
an inverted mask, a key that is not transposed, a missing ``1/sqrt(d)`` and an
off-by-one causal mask.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention import causal_mask, scaled_dot_product_attention
from attention.exercises import ExerciseError
from attention.exercises._checker import (
    Case,
    Mistake,
    Property,
    check,
    randn,
    random_mask,
    random_qkv,
)


def double(x):
    return 2 * x


CASES = [Case("a row", (randn(5, seed=0),)), Case("a matrix", (randn(3, 4, seed=1),))]


def failure(fn, cases=CASES, reference=double, **options) -> str:
    """The message of the ExerciseError that ``check`` raises for ``fn``."""
    with pytest.raises(ExerciseError) as caught:
        check(fn, reference, cases, what="doubles", **options)
    message = str(caught.value)
    assert "\n" not in message, f"not one line: {message!r}"
    return message


# --------------------------------------------------------------------------- passing


def test_a_correct_function_gets_one_line_saying_what_on_how_many_inputs(capsys):
    def my_double(x):
        return x + x

    check(my_double, double, CASES, what="doubles its input")
    assert (
        capsys.readouterr().out
        == "✓ my_double: doubles its input (2 inputs, within 1e-10)\n"
    )


def test_the_tolerance_is_stated_and_used(capsys):
    def close(x):
        return 2 * x + 1e-7

    check(close, double, CASES, what="doubles", atol=1e-6, rtol=1e-3)
    assert "within 1e-06 + 0.001·|expected|" in capsys.readouterr().out
    assert "(tolerance 1e-10)" in failure(close)


def test_exact_results_say_exactly(capsys):
    def mask(n):
        return torch.ones(n, n, dtype=torch.bool).tril()

    check(mask, lambda n: causal_mask(n), [Case("4 positions", (4,))], what="causal")
    assert capsys.readouterr().out == "✓ mask: causal (1 input, exactly)\n"
    check(double, double, CASES, what="doubles", atol=0.0)
    assert capsys.readouterr().out == "✓ double: doubles (2 inputs, exactly)\n"


# --------------------------------------------------------------------------- calling


def test_a_stub_is_named_as_a_stub():
    def my_double(x):
        """Twice x."""
        raise NotImplementedError("write your solution here")

    assert failure(my_double) == (
        "my_double is still a stub: replace `raise NotImplementedError` with your code"
    )


def test_a_stub_called_by_the_readers_function_is_named():
    def helper(x):
        raise NotImplementedError

    def my_double(x):
        return helper(x) * 2

    assert failure(my_double).startswith(
        "my_double calls helper, which is still a stub:"
    )


def test_a_not_implemented_error_that_is_not_a_stub_is_reported_as_raised():
    missing = NotImplementedError("no kernel for this dtype")

    def my_double(x):
        raise missing

    assert failure(my_double) == (
        "my_double raised NotImplementedError: no kernel for this dtype "
        "at `raise missing`, on case 'a row'"
    )


def test_an_exception_is_named_with_its_line_and_case():
    def my_double(x):
        y = x * 2
        return y.reshape(7)

    message = failure(my_double)
    assert message.startswith("my_double raised RuntimeError: shape '[7]' is invalid")
    assert message.endswith("at `return y.reshape(7)`, on case 'a row'")


def test_something_that_is_not_a_function_is_refused():
    def check_double(fn):
        __tracebackhide__ = True
        check(fn, double, CASES, what="doubles")

    with pytest.raises(
        ExerciseError,
        match=r"check_double needs your function itself, got a "
        r"Tensor: pass its name, check_double\(my_function\)",
    ):
        check_double(torch.ones(3))
    with pytest.raises(ExerciseError, match="got an int"):
        check_double(3)


# --------------------------------------------------------------------------- results


def test_none_asks_about_return():
    def my_double(x):
        2 * x

    assert failure(my_double) == (
        "my_double returned None on case 'a row': did you forget `return`?"
    )


def test_wrong_type():
    def my_double(x):
        return (2 * x).tolist()

    assert failure(my_double) == (
        "my_double returned a list of 5 on case 'a row', expected a torch.Tensor"
    )


def test_wrong_shape_names_got_expected_and_case():
    def my_double(x):
        return 2 * x if x.dim() == 1 else 2 * x.T

    assert failure(my_double) == (
        "my_double returned a tensor with shape (4, 3) on case 'a matrix', "
        "expected (3, 4)"
    )


def test_wrong_dtype_says_how_to_keep_it():
    def my_double(x):
        return 2 * x.float()

    assert failure(my_double).startswith(
        "my_double returned a tensor with dtype torch.float32 on case 'a row', "
        "expected torch.float64: make new tensors with the input's dtype"
    )


def test_nan_where_the_answer_is_finite_gives_the_index_and_the_hint():
    def my_double(x):
        return torch.where(x > 0, 2 * x, torch.nan)

    cases = [Case("a row", (randn(5, seed=0),), hint="exp overflowed")]
    x = cases[0].args[0]
    index = int((x <= 0).nonzero()[0, 0])
    expected = f"{2 * float(x[index]):.6g}"
    assert failure(my_double, cases) == (
        f"my_double returned nan at index ({index},) on case 'a row', where the answer "
        f"is {expected}: exp overflowed"
    )


def test_different_values_give_the_first_index_got_and_expected():
    def my_double(x):
        y = 2 * x
        if x.dim() == 2:
            y[1, 2] += 1
        return y

    x = CASES[1].args[0]
    got, want = f"{2 * float(x[1, 2]) + 1:.6g}", f"{2 * float(x[1, 2]):.6g}"
    assert failure(my_double) == (
        f"my_double is wrong at index (1, 2) on case 'a matrix': got {got}, expected "
        f"{want} (tolerance 1e-10)"
    )


def test_a_difference_below_six_digits_is_printed_in_full():
    def my_double(x):
        return 2 * x + 1e-9

    message = failure(my_double)
    x0 = float(CASES[0].args[0][0])
    assert f"got {2 * x0 + 1e-9!r}, expected {2 * x0!r}" in message


def test_tuple_results_name_the_wrong_element():
    def reference(x):
        return x.max(-1).values, x.sum(-1)

    def my_pair(x):
        return x.max(-1).values, x.sum(-1) + 1

    def my_triple(x):
        return x, x, x

    cases = [Case("rows", (randn(3, 4, seed=2),))]
    assert failure(my_pair, cases, reference, outputs=("m", "s")).startswith(
        "my_pair is wrong in s at index (0,) on case 'rows'"
    )
    assert failure(my_triple, cases, reference, outputs=("m", "s")) == (
        "my_triple returned a tuple of 3 on case 'rows', expected a tuple of 2 (m, s)"
    )


def test_a_broken_property_is_named_even_when_values_are_close():
    def reference(x):
        return torch.softmax(x, -1)

    def my_softmax(x):
        return torch.softmax(x, -1) + 1e-13  # close, but a masked weight is not 0

    x = randn(2, 4, seed=3)
    x[0, 1] = -math.inf
    rule = Property(
        "a -inf score must get weight exactly 0",
        lambda out, x: (out == 0) | (x > -math.inf),
    )
    assert failure(
        my_softmax, [Case("masked", (x,))], reference, properties=[rule]
    ) == (
        "my_softmax breaks a rule on case 'masked': a -inf score must get weight "
        "exactly 0 (it fails at index (0, 1))"
    )


def test_changing_the_input_in_place_is_named_and_the_cases_stay_intact():
    def my_double(x):
        x *= 2
        return x

    x = CASES[0].args[0].clone()
    assert failure(my_double) == (
        "my_double changed its input x in place on case 'a row': work on a new tensor "
        "(x = x - m, not x -= m)"
    )
    assert torch.equal(CASES[0].args[0], x)


def test_also_accept_admits_a_second_answer():
    def reference(x):
        return torch.softmax(x, -1)  # NaN for a row of -inf

    def zeros_there(x):
        return torch.nan_to_num(torch.softmax(x, -1), nan=0.0)

    x = randn(2, 3, seed=4)
    x[1] = -math.inf
    accept = Case("dead row", (x,), also_accept=zeros_there)
    check(zeros_there, reference, [accept], what="softmax")
    with pytest.raises(ExerciseError, match="got 0, expected nan"):
        check(zeros_there, reference, [Case("dead row", (x,))], what="softmax")


# --------------------------------------------------------------------------- mistakes


def test_a_known_mistake_is_named_with_its_evidence():
    def forgot_to_double(x):
        return x

    mistakes = [Mistake("it returns x unchanged: multiply by 2", lambda x: x)]
    x0 = f"{float(CASES[0].args[0][0]):.6g}"
    assert failure(forgot_to_double, mistakes=mistakes) == (
        f"forgot_to_double: it returns x unchanged: multiply by 2 (case 'a row': "
        f"got {x0} at index (0,), expected {float(2 * CASES[0].args[0][0]):.6g})"
    )


def test_a_mistake_that_is_right_on_a_case_is_not_blamed_there():
    def my_double(x):
        return 2 * x if x.dim() == 1 else 3 * x

    mistakes = [Mistake("right on rows, so never blamed for a row", lambda x: 2 * x)]
    assert "never blamed" not in failure(my_double, mistakes=mistakes)


def test_a_mistake_is_also_recognised_by_the_same_exception():
    def my_double(x):
        return x @ x

    mistakes = [Mistake("that is a matrix product: use *", lambda x: x @ x)]
    message = failure(my_double, [CASES[1]], mistakes=mistakes)
    assert message.startswith("my_double raised RuntimeError:")
    assert message.endswith("; that is a matrix product: use *")


# --------------------------------------------------------------------------- inputs


def test_the_builders_are_seeded_float64_and_build_traps():
    assert randn(3, seed=5).dtype == torch.float64
    assert torch.equal(randn(3, 4, seed=5), randn(3, 4, seed=5))
    assert not torch.equal(randn(3, 4, seed=5), randn(3, 4, seed=6))
    q, k, v = random_qkv()
    assert (q.shape, k.shape, v.shape) == (
        (3, 4),
        (5, 4),
        (5, 2),
    )  # i, j, d, e all differ
    assert all(t.dtype == torch.float64 for t in (q, k, v))
    mask = random_mask(2, 6, 5, seed=1)
    assert mask.dtype == torch.bool and mask.shape == (2, 6, 5)
    assert bool(mask.any(-1).all()) and bool((~mask).any(-1).all())
    with pytest.raises(ValueError, match="rows of at least 2 keys"):
        random_mask(3, 1)


def test_the_readers_exceptions_do_not_escape_but_the_references_do():
    def broken_reference(x):
        raise KeyError("the checker's own bug")

    with pytest.raises(KeyError):
        check(double, broken_reference, CASES, what="doubles")


def test_ipython_shows_the_error_as_one_line():
    error = ExerciseError("my_f is still a stub")
    assert error._render_traceback_() == [
        "\x1b[0;31mExerciseError\x1b[0m: my_f is still a stub"
    ]
    assert isinstance(error, AssertionError)


# ---------------------------------------------------------------------- attention traps
# A checker for "write attention with a boolean mask", built as a chapter's would be.


def reference_attention(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _attend(scores, mask, v):
    return torch.softmax(scores.masked_fill(~mask, -math.inf), -1) @ v


ATTENTION_MISTAKES = [
    Mistake(
        "the mask looks inverted: True must mean may attend",
        lambda q, k, v, mask: _attend(_scores(q, k), ~mask, v),
    ),
    Mistake(
        "K is not transposed: the scores are q @ k.transpose(-2, -1)",
        lambda q, k, v, mask: _attend(q @ k / math.sqrt(q.shape[-1]), mask, v),
    ),
    Mistake(
        "the scores are not divided by sqrt(d)",
        lambda q, k, v, mask: _attend(q @ k.transpose(-2, -1), mask, v),
    ),
]


def attention_cases():
    q, k, v = random_qkv(3, 5, d=4, e=2, seed=7)
    sq, sk, sv = random_qkv(4, 4, d=4, e=4, seed=8)  # square: a missing transpose runs
    causal = causal_mask(4)
    return [
        Case("i=3, j=5, d=4, e=2, random mask", (q, k, v, random_mask(3, 5, seed=9))),
        Case("i=j=d=e=4, causal mask", (sq, sk, sv, causal)),
    ]


def check_attention(fn):
    __tracebackhide__ = True
    check(
        fn,
        reference_attention,
        attention_cases(),
        what="masked attention",
        mistakes=ATTENTION_MISTAKES,
    )


def test_the_attention_checker_passes_a_correct_solution(capsys):
    def my_attention(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    check_attention(my_attention)
    assert capsys.readouterr().out.startswith(
        "✓ my_attention: masked attention (2 inputs"
    )


def test_an_inverted_mask_is_named():
    def my_attention(q, k, v, mask):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v

    with pytest.raises(ExerciseError, match="the mask looks inverted"):
        check_attention(my_attention)


def test_a_key_that_is_not_transposed_is_named_by_its_exception():
    def my_attention(q, k, v, mask):
        scores = q @ k / q.shape[-1] ** 0.5
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    with pytest.raises(ExerciseError) as caught:
        check_attention(my_attention)
    message = str(caught.value)
    assert message.startswith("my_attention raised RuntimeError:")
    assert "at `scores = q @ k / q.shape[-1] ** 0.5`" in message
    assert message.endswith(
        "K is not transposed: the scores are q @ k.transpose(-2, -1)"
    )


def test_a_missing_scale_is_named():
    def my_attention(q, k, v, mask):
        scores = q @ k.transpose(-2, -1)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    with pytest.raises(ExerciseError, match=r"not divided by sqrt\(d\)"):
        check_attention(my_attention)


# A checker for "build the causal mask", with boolean results compared exactly.

MASK_MISTAKES = [
    Mistake(
        "the mask looks inverted: True must mean may attend",
        lambda i, j: ~causal_mask(i, j),
    ),
    Mistake(
        "the diagonal is missing: a query may attend to its own position",
        lambda i, j: torch.ones(i, j, dtype=torch.bool).tril(-1),
    ),
    Mistake(
        "it is off by one: query q may see keys 0 ... q, not q + 1",
        lambda i, j: torch.ones(i, j, dtype=torch.bool).tril(1),
    ),
]


def check_causal_mask(fn):
    __tracebackhide__ = True
    cases = [Case("i = j = 4", (4, 4)), Case("i = 3 queries, j = 5 keys", (3, 5))]
    check(fn, causal_mask, cases, what="causal mask", mistakes=MASK_MISTAKES, atol=0.0)


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda i, j: torch.ones(i, j, dtype=torch.bool).triu(1), "looks inverted"),
        (lambda i, j: torch.ones(i, j).tril(-1) > 0, "the diagonal is missing"),
        (lambda i, j: torch.arange(j) <= torch.arange(i)[:, None] + 1, "off by one"),
    ],
)
def test_a_wrong_causal_mask_is_named(build, fragment):
    def my_causal_mask(i, j):
        return build(i, j)

    with pytest.raises(ExerciseError, match=fragment):
        check_causal_mask(my_causal_mask)


def test_a_causal_mask_of_the_wrong_dtype_is_told_to_compare():
    def my_causal_mask(i, j):
        return torch.ones(i, j).tril()

    with pytest.raises(ExerciseError, match="a mask is a bool tensor"):
        check_causal_mask(my_causal_mask)


def test_a_right_causal_mask_passes_exactly(capsys):
    def my_causal_mask(i, j):
        return torch.arange(j) <= torch.arange(i)[:, None]

    check_causal_mask(my_causal_mask)
    assert (
        capsys.readouterr().out == "✓ my_causal_mask: causal mask (2 inputs, exactly)\n"
    )
