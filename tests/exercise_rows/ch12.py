"""Chapter 12's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch12
from exercise_rows import Row

# -------------------------------------------------------------------------- gated delta


def my_gated_delta_step(state, q, k, v, beta, g, scale=None):
    """One token of the gated delta rule: decay, read, correct, write, read q."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = torch.exp(g) * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ (scale * q), new_state


def my_gated_delta_step_stub(state, q, k, v, beta, g, scale=None):
    """One token of the gated delta rule: decay, read, correct, write, read q."""
    raise NotImplementedError("write your solution here")


def gated_delta_reading_before_the_decay(state, q, k, v, beta, g, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    read = state.T @ k
    new_state = torch.exp(g) * state + beta * torch.outer(k, v - read)
    return new_state.T @ (scale * q), new_state


def gated_delta_decaying_after_the_write(state, q, k, v, beta, g, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    new_state = torch.exp(g) * (state + beta * torch.outer(k, v - state.T @ k))
    return new_state.T @ (scale * q), new_state


def gated_delta_with_g_as_the_factor(state, q, k, v, beta, g, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = g * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ (scale * q), new_state


def gated_delta_reading_the_old_state(state, q, k, v, beta, g, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = torch.exp(g) * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return decayed.T @ (scale * q), new_state


def gated_delta_without_the_scale(state, q, k, v, beta, g, scale=None):
    decayed = torch.exp(g) * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ q, new_state


def gated_delta_reading_s_k(state, q, k, v, beta, g, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = torch.exp(g) * state
    new_state = decayed + beta * torch.outer(k, v - decayed @ k)
    return new_state @ (scale * q), new_state


# --------------------------------------------------------------------------- KDA


def my_kda_step(state, q, k, v, g, beta, scale=None):
    """One token of KDA: row i of the state decays by exp(g[i]), then the delta step."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = torch.exp(g)[:, None] * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ (scale * q), new_state


def my_kda_step_stub(state, q, k, v, g, beta, scale=None):
    """One token of KDA: row i of the state decays by exp(g[i]), then the delta step."""
    raise NotImplementedError("write your solution here")


def kda_with_one_decay_for_all_channels(state, q, k, v, g, beta, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = torch.exp(g.mean()) * state
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ (scale * q), new_state


def kda_decaying_the_value_columns(state, q, k, v, g, beta, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    decayed = state * torch.exp(g)
    new_state = decayed + beta * torch.outer(k, v - decayed.T @ k)
    return new_state.T @ (scale * q), new_state


def kda_reading_before_the_decay(state, q, k, v, g, beta, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    read = state.T @ k
    new_state = torch.exp(g)[:, None] * state + beta * torch.outer(k, v - read)
    return new_state.T @ (scale * q), new_state


def kda_decaying_after_the_write(state, q, k, v, g, beta, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    written = state + beta * torch.outer(k, v - state.T @ k)
    new_state = torch.exp(g)[:, None] * written
    return new_state.T @ (scale * q), new_state


# --------------------------------------------------------------------------- Titans


def my_titans_update(weight, momentum, k, v, theta, eta, alpha):
    """One step of Titans' linear memory: surprise, momentum, forgetting."""
    surprise = 2 * torch.outer(weight @ k - v, k)  # gradient of ||W k - v||^2
    momentum = eta * momentum - theta * surprise
    return (1 - alpha) * weight + momentum, momentum


def my_titans_update_stub(weight, momentum, k, v, theta, eta, alpha):
    """One step of Titans' linear memory: surprise, momentum, forgetting."""
    raise NotImplementedError("write your solution here")


def titans_with_the_half(weight, momentum, k, v, theta, eta, alpha):
    surprise = torch.outer(weight @ k - v, k)
    momentum = eta * momentum - theta * surprise
    return (1 - alpha) * weight + momentum, momentum


def titans_at_the_forgotten_weights(weight, momentum, k, v, theta, eta, alpha):
    forgotten = (1 - alpha) * weight
    surprise = 2 * torch.outer(forgotten @ k - v, k)
    momentum = eta * momentum - theta * surprise
    return forgotten + momentum, momentum


def titans_climbing_the_gradient(weight, momentum, k, v, theta, eta, alpha):
    surprise = 2 * torch.outer(weight @ k - v, k)
    momentum = eta * momentum + theta * surprise
    return (1 - alpha) * weight + momentum, momentum


def titans_forgetting_the_new_momentum_too(weight, momentum, k, v, theta, eta, alpha):
    surprise = 2 * torch.outer(weight @ k - v, k)
    momentum = eta * momentum - theta * surprise
    return (1 - alpha) * (weight + momentum), momentum


def titans_keeping_alpha(weight, momentum, k, v, theta, eta, alpha):
    surprise = 2 * torch.outer(weight @ k - v, k)
    momentum = eta * momentum - theta * surprise
    return alpha * weight + momentum, momentum


def titans_without_momentum(weight, momentum, k, v, theta, eta, alpha):
    step = -theta * 2 * torch.outer(weight @ k - v, k)
    return (1 - alpha) * weight + step, step


ROWS = [
    Row(
        ch12.check_gated_delta_step,
        my_gated_delta_step,
        my_gated_delta_step_stub,
        (
            (gated_delta_reading_before_the_decay, "decay first, then read"),
            (gated_delta_decaying_after_the_write, "before the write"),
            (gated_delta_with_g_as_the_factor, "g is the log of the decay"),
            (gated_delta_reading_the_old_state, "from the new state"),
            (gated_delta_without_the_scale, "1/sqrt(d)"),
            (gated_delta_reading_s_k, "S^T k"),
        ),
    ),
    Row(
        ch12.check_kda_step,
        my_kda_step,
        my_kda_step_stub,
        (
            (kda_with_one_decay_for_all_channels, "one log-decay per key channel"),
            (kda_decaying_the_value_columns, "not along the value columns"),
            (kda_reading_before_the_decay, "decay first, then read"),
            (kda_decaying_after_the_write, "before the write"),
        ),
    ),
    Row(
        ch12.check_titans_update,
        my_titans_update,
        my_titans_update_stub,
        (
            (titans_with_the_half, "has no 1/2"),
            (titans_at_the_forgotten_weights, "previous weights"),
            (titans_climbing_the_gradient, "a step down the gradient"),
            (titans_forgetting_the_new_momentum_too, "forget the old weights only"),
            (titans_keeping_alpha, "the share forgotten"),
            (titans_without_momentum, "carries past surprise"),
        ),
    ),
]
