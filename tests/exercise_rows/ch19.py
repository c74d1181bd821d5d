"""Chapter 19's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

from attention.exercises import ch19
from exercise_rows import Row

# ----------------------------------------------------------------- previous token


def my_previous_token_score(weights):
    """The mean weight each query i >= 1 puts on key i - 1."""
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def my_previous_token_score_stub(weights):
    """The mean weight each query i >= 1 puts on key i - 1."""
    raise NotImplementedError("write your solution here")


def previous_score_of_the_next_token(weights):
    return weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)


def previous_score_over_every_query(weights):
    n = weights.shape[-1]
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / n


def previous_score_by_a_loop_over_the_diagonal(weights):
    n = weights.shape[-1]
    return sum(weights[..., i, i] for i in range(n)) / n


# ---------------------------------------------------------------------- induction


def my_induction_score(weights, period):
    """The mean weight each query i >= period puts on key i - period + 1."""
    stripe = weights.diagonal(offset=1 - period, dim1=-2, dim2=-1)
    return stripe[..., 1:].mean(-1)


def my_induction_score_stub(weights, period):
    """The mean weight each query i >= period puts on key i - period + 1."""
    raise NotImplementedError("write your solution here")


def induction_on_the_copy_itself(weights, period):
    n = weights.shape[-1]
    return sum(weights[..., i, i - period] for i in range(period, n)) / (n - period)


def induction_counting_the_first_repeat(weights, period):
    return weights.diagonal(offset=1 - period, dim1=-2, dim2=-1).mean(-1)


def induction_above_the_diagonal(weights, period):
    stripe = weights.diagonal(offset=period - 1, dim1=-2, dim2=-1)
    return stripe[..., 1:].mean(-1)


# ----------------------------------------------------------------------- QK circuit


def my_token_qk_circuit(w_embed, w_query, w_key):
    """W_E W_Q W_K^T W_E^T: the score of query token a for key token b."""
    queries, keys = w_embed @ w_query, w_embed @ w_key  # (..., V, d)
    return queries @ keys.transpose(-2, -1)


def my_token_qk_circuit_stub(w_embed, w_query, w_key):
    """W_E W_Q W_K^T W_E^T: the score of query token a for key token b."""
    raise NotImplementedError("write your solution here")


def qk_circuit_with_query_and_key_swapped(w_embed, w_query, w_key):
    return w_embed @ w_key @ w_query.transpose(-2, -1) @ w_embed.T


def qk_circuit_of_linear_weights(w_embed, w_query, w_key):
    return w_embed @ w_query.transpose(-2, -1) @ w_key @ w_embed.T


def qk_circuit_with_the_scale(w_embed, w_query, w_key):
    scores = (w_embed @ w_query) @ (w_embed @ w_key).transpose(-2, -1)
    return scores / math.sqrt(w_query.shape[-1])


def qk_circuit_on_the_stream(w_embed, w_query, w_key):
    return w_query @ w_key.transpose(-2, -1)


def qk_circuit_with_dot_t(w_embed, w_query, w_key):
    return w_embed @ w_query @ w_key.T @ w_embed.T


ROWS = [
    Row(
        ch19.check_previous_token_score,
        my_previous_token_score,
        my_previous_token_score_stub,
        (
            (previous_score_of_the_next_token, "the next token"),
            (previous_score_over_every_query, "it divides by n"),
            (previous_score_by_a_loop_over_the_diagonal, "the main diagonal"),
        ),
    ),
    Row(
        ch19.check_induction_score,
        my_induction_score,
        my_induction_score_stub,
        (
            (induction_on_the_copy_itself, "the earlier copy of the current token"),
            (induction_counting_the_first_repeat, "it counts query p - 1"),
            (induction_above_the_diagonal, "above the main diagonal"),
        ),
    ),
    Row(
        ch19.check_token_qk_circuit,
        my_token_qk_circuit,
        my_token_qk_circuit_stub,
        (
            (qk_circuit_with_query_and_key_swapped, "query and key are swapped"),
            (qk_circuit_of_linear_weights, "no transpose on w_query"),
            (qk_circuit_with_the_scale, "it divides by sqrt(d)"),
            (qk_circuit_on_the_stream, "the circuit on the stream"),
            (qk_circuit_with_dot_t, ".T reverses every axis"),
        ),
    ),
]
