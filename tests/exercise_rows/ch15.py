"""Chapter 15's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch

from attention.exercises import ch15
from exercise_rows import Row

# --------------------------------------------------------------------------- merge


def my_merge(out1, lse1, out2, lse2):
    """Attention over all keys from two parts' outputs and log-sum-exps."""
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse), torch.exp(lse2 - lse)
    return w1[..., None] * out1 + w2[..., None] * out2, lse


def my_merge_stub(out1, lse1, out2, lse2):
    """Attention over all keys from two parts' outputs and log-sum-exps."""
    raise NotImplementedError("write your solution here")


def merge_by_raw_exponentials(out1, lse1, out2, lse2):
    total = torch.exp(lse1) + torch.exp(lse2)
    out = torch.exp(lse1)[..., None] * out1 + torch.exp(lse2)[..., None] * out2
    return out, torch.log(total)


def merge_by_averaging(out1, lse1, out2, lse2):
    return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)


def merge_keeping_the_larger_lse(out1, lse1, out2, lse2):
    out, _ = my_merge(out1, lse1, out2, lse2)
    return out, torch.maximum(lse1, lse2)


def merge_adding_the_lses(out1, lse1, out2, lse2):
    out, _ = my_merge(out1, lse1, out2, lse2)
    return out, lse1 + lse2


# --------------------------------------------------------------------------- zigzag


def my_zigzag_positions(n, world_size, rank):
    """The positions rank holds in the zigzag layout: chunks rank and 2P - 1 - rank."""
    size = n // (2 * world_size)
    chunks = (rank, 2 * world_size - 1 - rank)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def my_zigzag_positions_stub(n, world_size, rank):
    """The positions rank holds in the zigzag layout: chunks rank and 2P - 1 - rank."""
    raise NotImplementedError("write your solution here")


def zigzag_neighbours(n, world_size, rank):
    size = n // (2 * world_size)
    return torch.arange(2 * rank * size, (2 * rank + 2) * size)


def zigzag_last_chunk_first(n, world_size, rank):
    return my_zigzag_positions(n, world_size, rank).view(2, -1).flip(0).reshape(-1)


def zigzag_partner_off_by_one(n, world_size, rank):
    size = n // (2 * world_size)
    chunks = (rank, 2 * world_size - 2 - rank)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def zigzag_of_p_chunks(n, world_size, rank):
    size = n // world_size
    chunks = (rank, world_size - 1 - rank)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def zigzag_as_floats(n, world_size, rank):
    return my_zigzag_positions(n, world_size, rank).float()


# --------------------------------------------------------------------------- tile


def my_backward_tile(q, k, v, d_out, lse, delta, scale):
    """One key block's share of dQ, and its dK and dV, from the saved lse and delta."""
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    dv = p.transpose(-2, -1) @ d_out
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def my_backward_tile_stub(q, k, v, d_out, lse, delta, scale):
    """One key block's share of dQ, and its dK and dV, from the saved lse and delta."""
    raise NotImplementedError("write your solution here")


def tile_without_delta(q, k, v, d_out, lse, delta, scale):
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
    ds = p * (d_out @ v.transpose(-2, -1))
    dv = p.transpose(-2, -1) @ d_out
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def tile_with_its_own_softmax(q, k, v, d_out, lse, delta, scale):
    p = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    dv = p.transpose(-2, -1) @ d_out
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def tile_forgetting_the_scale(q, k, v, d_out, lse, delta, scale):
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ d_out


def tile_with_p_not_transposed(q, k, v, d_out, lse, delta, scale):
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p @ d_out


ROWS = [
    Row(
        ch15.check_merge_partials,
        my_merge,
        my_merge_stub,
        (
            (merge_by_raw_exponentials, "not normalised"),
            (merge_by_averaging, "averaged"),
            (merge_keeping_the_larger_lse, "lse is the larger of the two"),
            (merge_adding_the_lses, "the log-sum-exps are added"),
        ),
    ),
    Row(
        ch15.check_zigzag_positions,
        my_zigzag_positions,
        my_zigzag_positions_stub,
        (
            (zigzag_neighbours, "two neighbouring chunks"),
            (zigzag_last_chunk_first, "the wrong order"),
            (zigzag_partner_off_by_one, "off by one"),
            (zigzag_of_p_chunks, "cut into P chunks"),
            (zigzag_as_floats, "dtype"),
        ),
    ),
    Row(
        ch15.check_backward_tile,
        my_backward_tile,
        my_backward_tile_stub,
        (
            (tile_without_delta, "delta is left out"),
            (tile_with_its_own_softmax, "renormalised within the tile"),
            (tile_forgetting_the_scale, "miss the scale"),
            (tile_with_p_not_transposed, "raised RuntimeError"),
        ),
    ),
]
