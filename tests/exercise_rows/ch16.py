"""Chapter 16's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch16
from exercise_rows import Row

# --------------------------------------------------------------------------- the step


def my_block_step(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    """flash_forward_block in PyTorch: fold one key/value block in, in base 2."""
    qk = q @ k.T * qk_scale
    qk = torch.where(visible, qk, -torch.inf)
    m_new = torch.maximum(m, qk.amax(-1))
    p = torch.exp2(qk - m_new[:, None])
    alpha = torch.exp2(m - m_new)
    return acc * alpha[:, None] + p @ v, m_new, l * alpha + p.sum(-1)


def my_block_step_stub(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    """flash_forward_block in PyTorch: fold one key/value block in, in base 2."""
    raise NotImplementedError("write your solution here")


def step_in_base_e(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    qk = torch.where(visible, q @ k.T * qk_scale, -torch.inf)
    m_new = torch.maximum(m, qk.amax(-1))
    p, alpha = torch.exp(qk - m_new[:, None]), torch.exp(m - m_new)
    return acc * alpha[:, None] + p @ v, m_new, l * alpha + p.sum(-1)


def step_ignoring_visible(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    return my_block_step(acc, m, l, q, k, v, qk_scale, torch.ones_like(visible))


def step_forgetting_to_rescale_acc(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    qk = torch.where(visible, q @ k.T * qk_scale, -torch.inf)
    m_new = torch.maximum(m, qk.amax(-1))
    p, alpha = torch.exp2(qk - m_new[:, None]), torch.exp2(m - m_new)
    return acc + p @ v, m_new, l * alpha + p.sum(-1)


def step_with_log2e_again(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    return my_block_step(acc, m, l, q, k, v, qk_scale * math.log2(math.e), visible)


# --------------------------------------------------------------------------- the grid


def my_grid(kernel, b, h, i, j, block_size):
    """(programs along axis 0, along axis 1) of one launch of the named kernel."""
    rows = j if kernel == "dkdv" else i
    return (math.ceil(rows / block_size), b * h)


def my_grid_stub(kernel, b, h, i, j, block_size):
    """(programs along axis 0, along axis 1) of one launch of the named kernel."""
    raise NotImplementedError("write your solution here")


def grid_by_floor_division(kernel, b, h, i, j, block_size):
    rows = j if kernel == "dkdv" else i
    return (rows // block_size, b * h)


def grid_heads_first(kernel, b, h, i, j, block_size):
    rows = j if kernel == "dkdv" else i
    return (b * h, math.ceil(rows / block_size))


def grid_always_over_queries(kernel, b, h, i, j, block_size):
    return (math.ceil(i / block_size), b * h)


def grid_per_batch(kernel, b, h, i, j, block_size):
    rows = j if kernel == "dkdv" else i
    return (math.ceil(rows / block_size), b)


# --------------------------------------------------------------------------- the tiles


def my_causal_tiles(num_queries, num_keys, block_size):
    """The tiles a causal program visits: 1 unmasked, 2 masked, 0 never loaded."""
    t_q, t_k = math.ceil(num_queries / block_size), math.ceil(num_keys / block_size)
    kinds = torch.zeros(t_q, t_k, dtype=torch.long)
    for m in range(t_q):
        below = min(m * block_size, num_keys)
        diagonal_end = min((m + 1) * block_size, num_keys)
        for n in range(t_k):
            start = n * block_size
            if start < below:
                kinds[m, n] = 1
            elif start < diagonal_end:
                kinds[m, n] = 2
    return kinds


def my_causal_tiles_stub(num_queries, num_keys, block_size):
    """The tiles a causal program visits: 1 unmasked, 2 masked, 0 never loaded."""
    raise NotImplementedError("write your solution here")


def tiles_of_a_full_program(num_queries, num_keys, block_size):
    t_q, t_k = math.ceil(num_queries / block_size), math.ceil(num_keys / block_size)
    return torch.ones(t_q, t_k, dtype=torch.long)


def tiles_with_an_unmasked_diagonal(num_queries, num_keys, block_size):
    return my_causal_tiles(num_queries, num_keys, block_size).clamp(max=1)


def tiles_shifted_right(num_queries, num_keys, block_size):
    t_q, t_k = math.ceil(num_queries / block_size), math.ceil(num_keys / block_size)
    m, n = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
    return torch.where(n <= m, 1, torch.where(n == m + 1, 2, 0))


def tiles_as_bools(num_queries, num_keys, block_size):
    return my_causal_tiles(num_queries, num_keys, block_size) > 0


ROWS = [
    Row(
        ch16.check_kernel_block_step,
        my_block_step,
        my_block_step_stub,
        (
            (step_in_base_e, "exp of base-2 scores"),
            (step_ignoring_visible, "visible is ignored"),
            (step_forgetting_to_rescale_acc, "the accumulator is not rescaled"),
            (step_with_log2e_again, "log2(e) is applied twice"),
        ),
    ),
    Row(
        ch16.check_launch_grid,
        my_grid,
        my_grid_stub,
        (
            (grid_by_floor_division, "floor division"),
            (grid_heads_first, "the axes are swapped"),
            (grid_always_over_queries, "one program per key block"),
            (grid_per_batch, "every batch·head pair"),
        ),
    ),
    Row(
        ch16.check_causal_tiles,
        my_causal_tiles,
        my_causal_tiles_stub,
        (
            (tiles_of_a_full_program, "the causal mask is ignored"),
            (tiles_with_an_unmasked_diagonal, "the diagonal block is left unmasked"),
            (tiles_shifted_right, "one block to the right"),
            (tiles_as_bools, "dtype"),
        ),
    ),
]
