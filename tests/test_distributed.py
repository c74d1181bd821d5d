"""Tests for attention/efficient/distributed.py: ring attention over gloo equals SDPA,
forward and backward.

Starting processes costs seconds (each imports torch), so the multi-process checks are
grouped: one 4-process run computes every configuration (4 ranks, and 2 ranks through
two sub-groups) and returns the results, which the tests then compare with torch's SDPA.
"""

import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist

from attention import scaled_dot_product_attention
from attention.efficient._launch import failing_worker, sleeping_worker
from attention.efficient.distributed import (
    ring_attention,
    ring_forward_backward,
    ring_schedule,
    run_distributed,
    shard_sequence,
    unshard_sequence,
)

F64 = torch.float64
SDPA = torch.nn.functional.scaled_dot_product_attention
N = 24  # divisible by 2P for P = 2 and 4
CONFIGS = [  # (layout, is_causal, scale)
    ("contiguous", False, None),
    ("contiguous", True, None),
    ("zigzag", False, 0.3),
    ("zigzag", True, None),
    ("contiguous", True, 0.3),
]


def _inputs(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(2, 3, n, 5, generator=g, dtype=F64) for _ in range(4)
    ]  # q, k, v, dO


def _reference(q, k, v, go, is_causal, scale):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = SDPA(q, k, v, is_causal=is_causal, scale=scale)
    out.backward(go)
    return out.detach(), q.grad, k.grad, v.grad


def _ring_in_group(
    group, q, k, v, go, layout, is_causal, scale, block_size, enable_gqa=False
):
    """Ring forward and backward inside ``group``; whole output and gradients gathered
    back."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    shards = [
        shard_sequence(t, size, rank, layout=layout).clone() for t in (q, k, v, go)
    ]
    q_, k_, v_ = (t.requires_grad_() for t in shards[:3])
    out = ring_attention(
        q_,
        k_,
        v_,
        is_causal=is_causal,
        scale=scale,
        group=group,
        layout=layout,
        block_size=block_size,
        enable_gqa=enable_gqa,
    )
    out.backward(shards[3])
    whole = []
    for local in (out.detach(), q_.grad, k_.grad, v_.grad):
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local, group=group)
        whole.append(unshard_sequence(parts, layout=layout))
    return whole


def _message(fn):
    try:
        fn()
    except (TypeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _all_checks(rank, world_size):
    """The 4-process run: every configuration on 4 ranks, on 2 ranks (sub-groups), and
    bad input."""
    q, k, v, go = _inputs()
    configs = [{"layout": lay, "is_causal": c, "scale": s} for lay, c, s in CONFIGS]
    runs = ring_forward_backward(rank, world_size, q, k, v, go, configs)
    results = {(4, *config): run for config, run in zip(CONFIGS, runs, strict=True)}
    # Two groups of two ranks run side by side; each rank passes its own group.
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[rank // 2]
    for layout, is_causal, scale in CONFIGS:
        for block_size in (
            128,
            5,
        ):  # one tile per block, and tiles that don't divide the chunk
            results[2, layout, is_causal, scale, block_size] = _ring_in_group(
                mine, q, k, v, go, layout, is_causal, scale, block_size
            )
    # grouped-query heads: 4 query heads read 2 key/value heads
    g_q, g_k, g_v, g_go = _gqa_inputs()
    for layout, is_causal in (("contiguous", True), ("zigzag", False)):
        results["gqa", layout, is_causal] = _ring_in_group(
            None, g_q, g_k, g_v, g_go, layout, is_causal, None, 4, enable_gqa=True
        )
    # a +inf in the last key: rank 0's causal queries never compute its tile
    p_q, p_k, p_v = _poisoned_inputs()
    for layout in ("contiguous", "zigzag"):
        shards = [
            shard_sequence(t, world_size, rank, layout=layout) for t in (p_q, p_k, p_v)
        ]
        with torch.no_grad():
            local = ring_attention(*shards, is_causal=True, layout=layout)
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local.contiguous())
        results["poisoned", layout] = unshard_sequence(parts, layout=layout)
    errors = {}
    # rank 3 passes a shard of another length: every rank must raise, none may wait
    n_local = 5 if rank == 3 else 6
    x = torch.randn(1, 2, n_local, 4, dtype=F64)
    errors["shapes"] = _message(lambda: ring_attention(x, x, x))
    errors["options"] = _message(
        lambda: ring_attention(
            q[..., :6, :], q[..., :6, :], q[..., :6, :], is_causal=rank == 0
        )
    )
    y = torch.randn(
        1, 2, 3, 4, dtype=F64
    )  # n = 12 is divisible by P = 4 but not by 2P = 8
    errors["zigzag"] = _message(lambda: ring_attention(y, y, y, layout="zigzag"))
    bad = "not a tensor" if rank == 2 else y
    errors["rank_2_bad"] = _message(lambda: ring_attention(bad, y, y))
    dist.barrier()  # everyone is still in step after the errors
    return results, errors


def _gqa_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, N, 5, generator=g, dtype=F64)
    k, v = (torch.randn(2, 2, N, 5, generator=g, dtype=F64) for _ in range(2))
    return q, k, v, torch.randn(2, 4, N, 5, generator=g, dtype=F64)


def _poisoned_inputs():
    q, k, v, _ = _inputs(seed=2)
    q, k = q.clone(), k.clone()
    q[..., 0] = 1.0  # every query meets the +inf below with a positive weight
    k[..., -1, 0] = float("inf")  # the last key: in every query's future
    return q, k, v


@pytest.fixture(scope="module")
def four_process_run():
    t0 = time.monotonic()
    out = run_distributed(_all_checks, 4, timeout=600)
    assert not multiprocessing.active_children()  # nothing left behind
    return out, time.monotonic() - t0


@pytest.mark.slow  # processes launched: make test, not make check
@pytest.mark.parametrize("layout, is_causal, scale", CONFIGS)
def test_ring_on_4_processes_equals_sdpa(four_process_run, layout, is_causal, scale):
    (results, _), _ = four_process_run
    got = results[4, layout, is_causal, scale]
    for a, b in zip(got, _reference(*_inputs(), is_causal, scale), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.slow  # processes launched: make test, not make check
@pytest.mark.parametrize("block_size", [128, 5])
@pytest.mark.parametrize("layout, is_causal, scale", CONFIGS)
def test_ring_on_2_processes_in_a_group_equals_sdpa(
    four_process_run, layout, is_causal, scale, block_size
):
    (results, _), _ = four_process_run
    got = results[2, layout, is_causal, scale, block_size]
    for a, b in zip(got, _reference(*_inputs(), is_causal, scale), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.slow  # processes launched: make test, not make check
@pytest.mark.parametrize("layout, is_causal", [("contiguous", True), ("zigzag", False)])
def test_ring_with_grouped_query_heads_equals_sdpa(four_process_run, layout, is_causal):
    (results, _), _ = four_process_run
    q, k, v, go = _gqa_inputs()
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = SDPA(q, k, v, is_causal=is_causal, enable_gqa=True)
    out.backward(go)
    expected = (out.detach(), q.grad, k.grad, v.grad)
    for a, b in zip(results["gqa", layout, is_causal], expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.slow  # processes launched: make test, not make check
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_an_inf_score_in_a_skipped_tile_makes_its_rows_nan(four_process_run, layout):
    """The package's rule: a +inf score poisons its row even against a key in the
    query's future, whose tile the causal ring never computes, as in the dense reference
    (which adds the causal mask to the scores, as torch adds an attn_mask)."""
    (results, _), _ = four_process_run
    q, k, v = _poisoned_inputs()
    expected = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert expected.isnan().all()
    torch.testing.assert_close(results["poisoned", layout], expected, equal_nan=True)


@pytest.mark.slow  # processes launched: make test, not make check
def test_bad_shards_raise_on_every_rank_before_blocking(four_process_run):
    (_, errors), _ = (
        four_process_run  # rank 0's view; the run finishing shows no rank waited
    )
    assert errors["shapes"].startswith(
        "ValueError: every rank must pass shards of one shape"
    )
    assert "(1, 2, 5, 4)" in errors["shapes"] and "rank 3" in errors["shapes"]
    assert errors["options"].startswith(
        "ValueError: every rank must pass shards of one shape"
    )
    assert errors["zigzag"].startswith(
        "ValueError: the zigzag layout needs n divisible by 2P = 8"
    )
    assert (
        errors["rank_2_bad"]
        == "ValueError: rank 2 of the group rejected its inputs: query must be a "
        "torch.Tensor, got str"
    )


# ------------------------------------------------------------- the launcher never hangs


@pytest.mark.slow  # processes launched: make test, not make check
def test_a_failing_rank_stops_the_others():
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 refuses"):
        run_distributed(
            failing_worker, 2, 1, timeout=600
        )  # rank 0 waits in a barrier for rank 1
    assert not multiprocessing.active_children()
    assert time.monotonic() - t0 < 300


@pytest.mark.slow  # processes launched: make test, not make check
def test_a_stuck_run_times_out_and_leaves_nothing():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="had not finished after 3 s"):
        run_distributed(sleeping_worker, 2, 3600.0, timeout=3)
    assert time.monotonic() - t0 < 3 + 15  # the deadline, plus stopping the processes
    assert not multiprocessing.active_children()


def test_launcher_rejects_bad_arguments():
    with pytest.raises(TypeError, match="importable by name"):
        run_distributed(lambda rank, size: None, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        run_distributed(sleeping_worker, 0, 1.0)
    with pytest.raises(
        ValueError, match="timeout must be a positive number of seconds"
    ):
        run_distributed(sleeping_worker, 1, 1.0, timeout=0)


# ---------------------------------------------------------------------- in this process


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_process_group_raises():
    assert not dist.is_initialized()
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match="needs an initialised process group"):
        ring_attention(q, q, q)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_one_rank_equals_sdpa(one_process_group, layout, is_causal):
    q, k, v, go = _inputs(10)
    (got,) = ring_forward_backward(
        0, 1, q, k, v, go, [{"layout": layout, "is_causal": is_causal, "scale": 0.7}]
    )
    for a, b in zip(got, _reference(q, k, v, go, is_causal, 0.7), strict=True):
        torch.testing.assert_close(a, b)


def test_bad_input_in_one_rank(one_process_group):
    q = torch.randn(1, 2, 5, 3)
    with pytest.raises(ValueError, match="zigzag layout needs n divisible by 2P = 2"):
        ring_attention(q, q, q, layout="zigzag")
    with pytest.raises(
        ValueError, match="layout must be 'contiguous' or 'zigzag', got 'striped'"
    ):
        ring_attention(q, q, q, layout="striped")
    with pytest.raises(TypeError, match="is_causal must be a bool .*got str"):
        ring_attention(q, q, q, is_causal="yes")
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        ring_attention(q, q, q, scale=True)
    with pytest.raises(
        TypeError, match="group must be a torch.distributed.ProcessGroup"
    ):
        ring_attention(q, q, q, group="world")
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 3 and 2"
    ):
        ring_attention(q, q[..., :2], q)
    with pytest.raises(
        ValueError, match="with is_causal the query and key shards must have one length"
    ):
        ring_attention(q, q[..., :4, :], q[..., :4, :], is_causal=True)
    with pytest.raises(ValueError, match="must be on (one|the same) device"):
        ring_attention(q, q.to("meta"), q)
    with pytest.raises(ValueError, match="ring_attention takes no attn_mask"):
        ring_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        ring_attention(q, q, q, enable_gqa=1)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        ring_attention(torch.randn(1, 3, 5, 3), q, q, enable_gqa=True)


# ----------------------------------------------------------------- layouts and schedule


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_unshard_round_trip(layout, world_size):
    x = torch.arange(2 * 2 * world_size * 3).reshape(2, 2 * world_size * 3, 1)
    shards = [
        shard_sequence(x, world_size, r, layout=layout) for r in range(world_size)
    ]
    assert torch.equal(unshard_sequence(shards, layout=layout), x)
    y = torch.arange(4 * world_size)
    parts = [
        shard_sequence(y, world_size, r, layout=layout, dim=0)
        for r in range(world_size)
    ]
    assert torch.equal(unshard_sequence(parts, layout=layout, dim=0), y)


def test_layout_positions():
    pos = torch.arange(16)
    assert [shard_sequence(pos, 4, r, dim=0).tolist() for r in (0, 3)] == [
        [0, 1, 2, 3],
        [12, 13, 14, 15],
    ]
    zig = [shard_sequence(pos, 4, r, layout="zigzag", dim=0).tolist() for r in range(4)]
    assert zig == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]


def test_shard_rejects_bad_input():
    x = torch.zeros(2, 10, 3)
    with pytest.raises(
        ValueError,
        match="contiguous layout needs a sequence length n divisible by P = 3, "
        "got n = 10",
    ):
        shard_sequence(x, 3, 0)
    with pytest.raises(
        ValueError,
        match="zigzag layout needs a sequence length n divisible by 2P = 4, got n = 10",
    ):
        shard_sequence(x, 2, 0, layout="zigzag")
    with pytest.raises(ValueError, match="rank must be < world_size = 2, got 2"):
        shard_sequence(x, 2, 2)
    with pytest.raises(ValueError, match="dim must lie in"):
        shard_sequence(x, 2, 0, dim=3)
    with pytest.raises(TypeError, match="world_size must be an int, got float"):
        shard_sequence(x, 2.0, 0)
    with pytest.raises(ValueError, match="every shard must have one shape"):
        unshard_sequence([x, x[:, :4]])
    with pytest.raises(TypeError, match="shards must be a non-empty list or tuple"):
        unshard_sequence(x)
    with pytest.raises(ValueError, match="odd length"):
        unshard_sequence([x[:, :3]], layout="zigzag")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_schedule_visits_every_block_once_and_zigzag_balances(world_size):
    for layout in ("contiguous", "zigzag"):
        schedule = ring_schedule(world_size, layout=layout)
        for r in range(world_size):
            assert sorted(step[r]["source"] for step in schedule) == list(
                range(world_size)
            )
    work = {}
    for layout in ("contiguous", "zigzag"):
        schedule = ring_schedule(world_size, layout=layout, is_causal=True)
        # tiles of one chunk against one chunk, weighted to the contiguous chunk size
        weight = {"contiguous": 1.0, "zigzag": 0.25}[layout]
        work[layout] = [
            sum(
                weight * (1.0 if kind == "full" else 0.5)
                for step in schedule
                for *_, kind in step[r]["pairs"]
            )
            for r in range(world_size)
        ]
    assert work["contiguous"] == [
        r + 0.5 for r in range(world_size)
    ]  # rank r: r blocks and a triangle
    assert len(set(work["zigzag"])) == 1  # every rank the same
    assert sum(work["zigzag"]) == pytest.approx(sum(work["contiguous"]))
