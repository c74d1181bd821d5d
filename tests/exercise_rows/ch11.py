"""Chapter 11's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch

from attention.exercises import ch11
from exercise_rows import Row

# --------------------------------------------------------------------------- one step


def my_delta_step(S, k, v, beta):
    """One delta-rule write: read S^T k, then add beta k (v - S^T k)^T."""
    correction = v - k @ S  # (e,): the value minus what the memory returns
    return S + beta * torch.outer(k, correction)


def my_delta_step_stub(S, k, v, beta):
    """One delta-rule write: read S^T k, then add beta k (v - S^T k)^T."""
    raise NotImplementedError("write your solution here")


def step_writing_the_sum(S, k, v, beta):
    return S + beta * torch.outer(k, v)


def step_with_beta_outside(S, k, v, beta):
    return beta * (S + torch.outer(k, v - k @ S))


def step_with_beta_on_the_value(S, k, v, beta):
    return S + torch.outer(k, beta * v - k @ S)


def step_reading_s_times_k(S, k, v, beta):
    return S + beta * torch.outer(k, v - S @ k)


def step_in_place(S, k, v, beta):
    S += beta * torch.outer(k, v - k @ S)
    return S


def step_with_the_outer_product_flipped(S, k, v, beta):
    return S + beta * torch.outer(v - k @ S, k)


# --------------------------------------------------------------------------- decayed


def my_decayed_attention(q, k, v, log_alpha):
    """Gated linear attention token by token: decay, write, then read."""
    S = q.new_zeros(k.shape[1], v.shape[1])  # (d, e)
    rows = []
    for t in range(q.shape[0]):
        S = log_alpha[t].exp() * S + torch.outer(k[t], v[t])
        rows.append(q[t] @ S)  # S_t^T q_t
    return torch.stack(rows)


def my_decayed_attention_stub(q, k, v, log_alpha):
    """Gated linear attention token by token: decay, write, then read."""
    raise NotImplementedError("write your solution here")


def decayed_after_the_write(q, k, v, log_alpha):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        S = log_alpha[t].exp() * (S + torch.outer(k[t], v[t]))
        rows.append(q[t] @ S)
    return torch.stack(rows)


def decayed_reading_first(q, k, v, log_alpha):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        rows.append(q[t] @ S)
        S = log_alpha[t].exp() * S + torch.outer(k[t], v[t])
    return torch.stack(rows)


def decayed_by_the_log(q, k, v, log_alpha):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        S = log_alpha[t] * S + torch.outer(k[t], v[t])
        rows.append(q[t] @ S)
    return torch.stack(rows)


def decayed_without_decay(q, k, v, log_alpha):
    return torch.stack([q[t] @ (k[: t + 1].T @ v[: t + 1]) for t in range(q.shape[0])])


def decayed_with_the_gate_of_the_next_token(q, k, v, log_alpha):
    shifted = torch.cat([log_alpha[1:], log_alpha[-1:]])
    return my_decayed_attention(q, k, v, shifted)


# --------------------------------------------------------------------------- chunkwise


def my_chunkwise_delta(q, k, v, beta, chunk_size):
    """The delta rule chunk by chunk, from the WY/UT form of each chunk."""
    S = q.new_zeros(k.shape[1], v.shape[1])  # (d, e): the state entering the chunk
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        Q, K, V, b = (x[a : a + chunk_size] for x in (q, k, v, beta))
        A = torch.tril(b[:, None] * (K @ K.T), -1)  # (c, c), strictly lower
        T = torch.eye(K.shape[0], dtype=q.dtype) + A
        W = torch.linalg.solve_triangular(T, b[:, None] * K, upper=False)  # (c, d)
        U = torch.linalg.solve_triangular(T, b[:, None] * V, upper=False)  # (c, e)
        U = U - W @ S  # the corrections, given the entering state
        rows.append(Q @ S + torch.tril(Q @ K.T) @ U)  # read S, then this chunk
        S = S + K.T @ U
    return torch.cat(rows)


def my_chunkwise_delta_stub(q, k, v, beta, chunk_size):
    """The delta rule chunk by chunk, from the WY/UT form of each chunk."""
    raise NotImplementedError("write your solution here")


def _chunks(q, k, v, beta, chunk_size, **faults):
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        Q, K, V, b = (x[a : a + chunk_size] for x in (q, k, v, beta))
        A = torch.tril(b[:, None] * (K @ K.T), faults.get("diagonal", -1))
        T = torch.eye(K.shape[0], dtype=q.dtype) + faults.get("sign", 1) * A
        W = torch.linalg.solve_triangular(T, b[:, None] * K, upper=False)
        U = torch.linalg.solve_triangular(T, b[:, None] * V, upper=False)
        if not faults.get("no_state"):
            U = U - W @ S
        S_next = S + K.T @ U
        read = S_next if faults.get("read_after") else S
        rows.append(Q @ read + torch.tril(Q @ K.T, faults.get("keep", 0)) @ U)
        S = S_next
    return torch.cat(rows)


def chunks_with_the_diagonal_in_a(q, k, v, beta, chunk_size):
    return _chunks(q, k, v, beta, chunk_size, diagonal=0)


def chunks_solving_i_minus_a(q, k, v, beta, chunk_size):
    return _chunks(q, k, v, beta, chunk_size, sign=-1)


def chunks_ignoring_the_state(q, k, v, beta, chunk_size):
    return _chunks(q, k, v, beta, chunk_size, no_state=True)


def chunks_reading_the_new_state(q, k, v, beta, chunk_size):
    return _chunks(q, k, v, beta, chunk_size, read_after=True)


def chunks_with_a_strict_read_mask(q, k, v, beta, chunk_size):
    return _chunks(q, k, v, beta, chunk_size, keep=-1)


def chunks_summing_beta_k_v(q, k, v, beta, chunk_size):
    weights = torch.tril(q @ k.T) * beta[None, :]
    return weights @ v


ROWS = [
    Row(
        ch11.check_delta_rule_step,
        my_delta_step,
        my_delta_step_stub,
        (
            (step_writing_the_sum, "that is linear attention's sum"),
            (step_with_beta_outside, "beta multiplies the whole new state"),
            (step_with_beta_on_the_value, "beta scales the value only"),
            (step_reading_s_times_k, "read it with S^T k"),
            (step_in_place, "changed its input S in place"),
            (step_with_the_outer_product_flipped, "the write is flipped"),
        ),
    ),
    Row(
        ch11.check_decayed_recurrence,
        my_decayed_attention,
        my_decayed_attention_stub,
        (
            (decayed_after_the_write, "the decay is applied after the write"),
            (decayed_reading_first, "reads before its own pair is written"),
            (decayed_by_the_log, "the gate is given as its log"),
            (decayed_without_decay, "the decay is missing"),
            (decayed_with_the_gate_of_the_next_token, "is wrong at index"),
        ),
    ),
    Row(
        ch11.check_chunkwise_delta_rule,
        my_chunkwise_delta,
        my_chunkwise_delta_stub,
        (
            (chunks_with_the_diagonal_in_a, "A keeps its diagonal"),
            (chunks_solving_i_minus_a, "not (I - A)"),
            (chunks_ignoring_the_state, "U = U~ - W S"),
            (chunks_reading_the_new_state, "read the updated state"),
            (chunks_with_a_strict_read_mask, "misses its own correction"),
            (chunks_summing_beta_k_v, "that is the sum of beta k v^T"),
        ),
    ),
]
