"""Cost of one generated token: softmax with a KV cache against recurrent states
(chapters 10 and 11).

Setting: one attention layer's core (no projections), batch 1, 8 heads, d = e = 64,
fp32, one thread, ``torch.inference_mode()``. For each context length ``L`` every
contender produces the output of token ``L + 1`` given what it keeps of the ``L`` tokens
before it:

* ``softmax_cache``: the new key and value are written into a preallocated KV cache and
  the query attends to all ``L + 1`` cached keys with PyTorch's fused
  ``scaled_dot_product_attention``: the work and the memory read grow with ``L``.
* ``linear_step``: ``attention.linear_attention_step`` (elu + 1, with the normaliser):
  ``S <- S + phi(k) v^T``, ``z <- z + phi(k)``, one read.
* ``delta_step``: ``attention.delta_rule_attention`` on one token with ``initial_state``
  (the delta rule's read, correct and write).
* ``gated_delta_step``: ``attention.gated_delta_rule_attention`` likewise, with a decay.

The package functions check their arguments on every call (shapes, ``beta`` in ``[0,
1]``, ``g <= 0``), a fixed cost of some microseconds that a fused kernel would not pay;
at short contexts it is a visible share of a step. The recurrent steps cost the same at
every ``L``; they are timed at every ``L`` anyway. Each step is checked against its
sequence form before timing.

**Each contender in its own loop.** A first version timed the four contenders call by
call in turn. Between two calls of a recurrent step the softmax step swept its cache (up
to 256 MiB) through the processor's caches and evicted the step's 128 KiB state, so the
recurrent steps' times rose with ``L`` (52 to 271 microseconds) although their work does
not. Now every round gives each contender a block of its own: one untimed call that
brings its tensors back into the caches, then ``BLOCK`` timed calls in a row
(``_common.interleaved_clocks(block=...)``). The rounds still alternate between the
contenders, so a slow spell of the machine hits them all alike.

Saved per contender and length: median, first and third quartile (``q1``, ``q3``) of the
``repeat * BLOCK`` samples of the thread CPU time (``time.thread_time``: with one
thread, the work done) and of the wall time; the bytes the contender holds between
tokens (KV cache for ``L + 1`` tokens, or the state), computed from the tensor shapes;
and the extra peak memory of one step measured by ``_common.peak_memory_mib`` in a fresh
process. Also the KV-cache bytes per token and per layer, and the context length at
which the cache outgrows each state.

The 1-minute load average is recorded; when it exceeds the core count the results are
not saved (timings on a busy machine measure the machine). ``--quick`` runs tiny sizes
and saves to a temporary folder.

Run: ``.venv/bin/python benchmarks/recurrent.py`` (a few minutes on one idle core).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import (
    THREADS,
    begin,
    by_point,
    finish,
    omp_wait_policy,
    sweep,
    with_quartiles,
)

from attention import (
    delta_rule_attention,
    gated_delta_rule_attention,
    linear_attention,
    linear_attention_step,
)

ORDER = 100  # place in run_all.py's session
HEADS, DIM = 8, 64
CONTEXTS, QUICK_CONTEXTS = [256, 1024, 4096, 16384, 65536], [64, 256]
WARMUP, REPEAT = 3, 15
BLOCK = 5  # timed calls in a row per contender and round, after one untimed call
NAMES = ("softmax_cache", "linear_step", "delta_step", "gated_delta_step")


def _token(seed: int):
    """One token's query, key (unit norm, as DeltaNet uses), value, beta and
    log-decay."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(1, HEADS, 1, DIM, generator=g) for _ in range(3)
    )  # (b, h, 1, d)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(1, HEADS, 1, generator=g)  # (b, h, 1)
    log_decay = -0.1 * torch.rand(1, HEADS, 1, generator=g)  # (b, h, 1)
    return q, k, v, beta, log_decay


def make_softmax_cache(length: int):
    """Zero-argument callable: decode token L + 1 against a KV cache holding L
    tokens."""
    g = torch.Generator().manual_seed(1)
    cache_k = torch.randn(1, HEADS, length + 1, DIM, generator=g)  # (b, h, L + 1, d)
    cache_v = torch.randn(1, HEADS, length + 1, DIM, generator=g)
    q, k, v, _, _ = _token(2)

    def step():
        cache_k[:, :, length : length + 1] = k  # write the new token in place
        cache_v[:, :, length : length + 1] = v
        return torch.nn.functional.scaled_dot_product_attention(q, cache_k, cache_v)

    return step


def _state(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(1, HEADS, DIM, DIM, generator=g)  # (b, h, d, e)


def make_linear_step(length: int = 0):
    """Zero-argument callable: one step of causal linear attention (state S, z)."""
    q, k, v, _, _ = _token(2)
    state = (
        _state().abs(),
        torch.rand(1, HEADS, DIM, generator=torch.Generator().manual_seed(4)),
    )
    return lambda: linear_attention_step(
        q[..., 0, :], k[..., 0, :], v[..., 0, :], state
    )[0]


def make_delta_step(length: int = 0):
    """Zero-argument callable: one delta-rule token from a given state."""
    q, k, v, beta, _ = _token(2)
    state = _state()
    return lambda: delta_rule_attention(
        q, k, v, beta, initial_state=state, output_final_state=True
    )


def make_gated_delta_step(length: int = 0):
    """Zero-argument callable: one gated-delta-rule token from a given state."""
    q, k, v, beta, log_decay = _token(2)
    state = _state()
    return lambda: gated_delta_rule_attention(
        q, k, v, beta, log_decay, initial_state=state, output_final_state=True
    )


MAKERS = {
    "softmax_cache": make_softmax_cache,
    "linear_step": make_linear_step,
    "delta_step": make_delta_step,
    "gated_delta_step": make_gated_delta_step,
}


def held_bytes(name: str, length: int) -> int:
    """Bytes kept between tokens (fp32): the cache for L + 1 tokens, or the state."""
    if name == "softmax_cache":
        return 2 * HEADS * (length + 1) * DIM * 4  # keys and values
    if name == "linear_step":
        return (HEADS * DIM * DIM + HEADS * DIM) * 4  # S and z
    return HEADS * DIM * DIM * 4  # S


def check_steps() -> None:
    """Each step equals the last row of its sequence form (float64, 6 tokens)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, HEADS, 6, DIM, generator=g, dtype=torch.float64)
        for _ in range(3)
    )
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(1, HEADS, 6, generator=g, dtype=torch.float64)
    log_decay = -torch.rand(1, HEADS, 6, generator=g, dtype=torch.float64)
    for name, whole, step in (
        (
            "delta",
            delta_rule_attention(q, k, v, beta),
            lambda s, t: delta_rule_attention(
                q[..., t : t + 1, :],
                k[..., t : t + 1, :],
                v[..., t : t + 1, :],
                beta[..., t : t + 1],
                initial_state=s,
                output_final_state=True,
            ),
        ),
        (
            "gated delta",
            gated_delta_rule_attention(q, k, v, beta, log_decay),
            lambda s, t: gated_delta_rule_attention(
                q[..., t : t + 1, :],
                k[..., t : t + 1, :],
                v[..., t : t + 1, :],
                beta[..., t : t + 1],
                log_decay[..., t : t + 1],
                initial_state=s,
                output_final_state=True,
            ),
        ),
    ):
        state = None
        for t in range(6):
            out, state = step(state, t)
        assert torch.allclose(out[..., 0, :], whole[..., -1, :], atol=1e-10), name
    state = None
    for t in range(6):
        out, state = linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], state
        )
    assert torch.allclose(
        out, linear_attention(q, k, v, is_causal=True)[..., -1, :], atol=1e-10
    )
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    last = torch.nn.functional.scaled_dot_product_attention(q[..., -1:, :], k, v)
    assert torch.allclose(last[..., 0, :], full[..., -1, :], atol=1e-10)


def main() -> None:
    run = begin("recurrent")
    torch.set_num_threads(THREADS)
    contexts = QUICK_CONTEXTS if run.quick else CONTEXTS
    warmup, repeat = (1, run.repeat) if run.quick else (WARMUP, REPEAT)
    check_steps()
    result = sweep(
        run,
        contexts,
        MAKERS,
        memory=True,
        warmup=warmup,
        repeat=repeat,
        clocks="wall+cpu",
        label="L",
        block=BLOCK,
    )
    kv_per_token = 2 * HEADS * DIM * 4
    state_bytes = {n: held_bytes(n, 0) for n in NAMES if n != "softmax_cache"}
    setting = {
        "batch": 1,
        "heads": HEADS,
        "d": DIM,
        "e": DIM,
        "dtype": "float32",
        "mode": "one decode step, inference_mode",
        "warmup": warmup,
        "repeat": repeat,
        "block": BLOCK,
        "timing": "each contender in its own loop: per round, one untimed call, "
        "then block timed calls in a row; rounds alternate",
        "omp_wait_policy": omp_wait_policy(),
    }
    clock = "cpu_s: time.thread_time of the one compute thread; wall_s: perf_counter"
    finish(
        run,
        {
            "setting": setting,
            "contexts": contexts,
            "contenders": list(NAMES),
            "clock": clock,
            "cpu_s": by_point(with_quartiles(result, "cpu_s"), contexts),
            "wall_s": by_point(with_quartiles(result, "time_s"), contexts),
            "held_bytes": {n: [held_bytes(n, L) for L in contexts] for n in NAMES},
            "step_peak_mib": result["peak_mib"],
            "kv_cache_bytes_per_token_per_layer": kv_per_token,
            "state_bytes_per_layer": state_bytes,
            "break_even_tokens": {n: b / kv_per_token for n, b in state_bytes.items()},
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
