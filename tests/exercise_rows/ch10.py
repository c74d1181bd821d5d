"""Chapter 10's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch
import torch.nn.functional as F

from attention.exercises import ch10
from exercise_rows import Row

# --------------------------------------------------------------------------- kernel


def my_linear_attention(q, k, v):
    """Non-causal linear attention with phi(x) = elu(x) + 1."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S, z = phi_k.T @ v, phi_k.sum(0)
    return (phi_q @ S) / (phi_q @ z + 1e-6).unsqueeze(-1)


def my_linear_attention_stub(q, k, v):
    """Non-causal linear attention with phi(x) = elu(x) + 1."""
    raise NotImplementedError("write your solution here")


def linear_attention_without_eps(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(0)).unsqueeze(-1)


def linear_attention_without_normaliser(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    return phi_q @ (phi_k.T @ v)


def linear_attention_with_plain_elu(q, k, v):
    phi_q, phi_k = F.elu(q), F.elu(k)
    return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(0)).unsqueeze(-1)


def linear_attention_as_softmax(q, k, v):
    return torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1) @ v


def linear_attention_with_relu(q, k, v):
    phi_q, phi_k = F.relu(q), F.relu(k)
    return (phi_q @ (phi_k.T @ v)) / (phi_q @ phi_k.sum(0) + 1e-6).unsqueeze(-1)


def linear_attention_key_transposed(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    return (phi_q @ (phi_k @ v)) / (phi_q @ phi_k.sum(0)).unsqueeze(-1)


# --------------------------------------------------------------------------- recurrence


def my_causal_linear_attention(q, k, v):
    """Causal linear attention token by token: write S_t and z_t, then read."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])  # (d, e)
    z = q.new_zeros(k.shape[1])  # (d,)
    rows = []
    for t in range(q.shape[0]):
        S = S + torch.outer(phi_k[t], v[t])
        z = z + phi_k[t]
        rows.append((phi_q[t] @ S) / (phi_q[t] @ z + 1e-6))
    return torch.stack(rows)


def my_causal_linear_attention_stub(q, k, v):
    """Causal linear attention token by token: write S_t and z_t, then read."""
    raise NotImplementedError("write your solution here")


def recurrence_reading_first(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])
    z = q.new_zeros(k.shape[1])
    rows = []
    for t in range(q.shape[0]):
        rows.append((phi_q[t] @ S) / (phi_q[t] @ z + 1e-6))
        S = S + torch.outer(phi_k[t], v[t])
        z = z + phi_k[t]
    return torch.stack(rows)


def recurrence_without_normaliser(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for t in range(q.shape[0]):
        S = S + torch.outer(phi_k[t], v[t])
        rows.append(phi_q[t] @ S)
    return torch.stack(rows)


def recurrence_over_every_key(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S, z = phi_k.T @ v, phi_k.sum(0)
    return torch.stack([(phi_q[t] @ S) / (phi_q[t] @ z) for t in range(q.shape[0])])


def recurrence_with_whole_normaliser(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])
    z = phi_k.sum(0)
    rows = []
    for t in range(q.shape[0]):
        S = S + torch.outer(phi_k[t], v[t])
        rows.append((phi_q[t] @ S) / (phi_q[t] @ z))
    return torch.stack(rows)


def recurrence_with_value_outer_key(q, k, v):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(v.shape[1], k.shape[1])
    z = q.new_zeros(k.shape[1])
    rows = []
    for t in range(q.shape[0]):
        S = S + torch.outer(v[t], phi_k[t])
        z = z + phi_k[t]
        rows.append((phi_q[t] @ S) / (phi_q[t] @ z))
    return torch.stack(rows)


# --------------------------------------------------------------------------- chunked


def my_chunked_linear_attention(q, k, v, chunk_size):
    """Causal linear attention chunk by chunk: tiles inside, the state between."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])  # (d, e): the earlier chunks
    z = q.new_zeros(k.shape[1])  # (d,)
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        pq, pk = phi_q[a : a + chunk_size], phi_k[a : a + chunk_size]
        vc = v[a : a + chunk_size]
        tile = (pq @ pk.T).tril()  # (c, c): keys j <= i of this chunk
        num = tile @ vc + pq @ S
        den = tile.sum(-1) + pq @ z
        rows.append(num / (den + 1e-6).unsqueeze(-1))
        S, z = S + pk.T @ vc, z + pk.sum(0)  # only now: the chunk joins the state
    return torch.cat(rows)


def my_chunked_linear_attention_stub(q, k, v, chunk_size):
    """Causal linear attention chunk by chunk: tiles inside, the state between."""
    raise NotImplementedError("write your solution here")


def _chunks(q, k, v, chunk_size, *, diagonal=0, mask=True, update_first=False):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])
    z = q.new_zeros(k.shape[1])
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        pq, pk = phi_q[a : a + chunk_size], phi_k[a : a + chunk_size]
        vc = v[a : a + chunk_size]
        if update_first:
            S, z = S + pk.T @ vc, z + pk.sum(0)
        tile = pq @ pk.T
        if mask:
            tile = tile.tril(diagonal)
        rows.append((tile @ vc + pq @ S) / (tile.sum(-1) + pq @ z).unsqueeze(-1))
        if not update_first:
            S, z = S + pk.T @ vc, z + pk.sum(0)
    return torch.cat(rows)


def chunks_without_the_tile_mask(q, k, v, chunk_size):
    return _chunks(q, k, v, chunk_size, mask=False)


def chunks_updating_the_state_first(q, k, v, chunk_size):
    return _chunks(q, k, v, chunk_size, update_first=True)


def chunks_with_a_strict_mask(q, k, v, chunk_size):
    return _chunks(q, k, v, chunk_size, diagonal=-1)


def chunks_dropping_the_last_one(q, k, v, chunk_size):
    whole = (q.shape[0] // chunk_size) * chunk_size
    return my_chunked_linear_attention(q[:whole], k[:whole], v[:whole], chunk_size)


def chunks_without_normaliser(q, k, v, chunk_size):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    S = q.new_zeros(k.shape[1], v.shape[1])
    rows = []
    for a in range(0, q.shape[0], chunk_size):
        pq, pk = phi_q[a : a + chunk_size], phi_k[a : a + chunk_size]
        vc = v[a : a + chunk_size]
        rows.append((pq @ pk.T).tril() @ vc + pq @ S)
        S = S + pk.T @ vc
    return torch.cat(rows)


ROWS = [
    Row(
        ch10.check_linear_attention,
        my_linear_attention,
        my_linear_attention_stub,
        (
            (linear_attention_without_normaliser, "the normaliser is missing"),
            (linear_attention_with_plain_elu, "the + 1 is missing"),
            (linear_attention_as_softmax, "that is softmax attention"),
            (linear_attention_with_relu, "is wrong at index"),
            (linear_attention_key_transposed, "raised RuntimeError"),
        ),
    ),
    Row(
        ch10.check_causal_linear_recurrence,
        my_causal_linear_attention,
        my_causal_linear_attention_stub,
        (
            (recurrence_reading_first, "reads the state before its own key"),
            (recurrence_without_normaliser, "the normaliser is missing"),
            (recurrence_over_every_key, "every query sees every key"),
            (recurrence_with_whole_normaliser, "z_t must be a running sum"),
            (recurrence_with_value_outer_key, "raised RuntimeError"),
        ),
    ),
    Row(
        ch10.check_chunked_linear_attention,
        my_chunked_linear_attention,
        my_chunked_linear_attention_stub,
        (
            (chunks_without_the_tile_mask, "see later keys of their own chunk"),
            (chunks_updating_the_state_first, "added to the state before"),
            (chunks_with_a_strict_mask, "keep the tile's diagonal"),
            (chunks_dropping_the_last_one, "the last, shorter chunk is missing"),
            (chunks_without_normaliser, "the normaliser is missing"),
        ),
    ),
]
