"""Decode time per token with and without a KV cache, for multi-head and latent
attention (chapter 18).

Setting: one attention layer, batch 1, embed 512, 8 heads, fp32,
``torch.inference_mode()``, under the protocol of ``_common`` (one thread, passive
OpenMP waiting, contenders interleaved, 15 repeats after warm-up, median and quartiles
saved). For each context length ``L`` the task is the same: produce the layer's output
for token ``L + 1`` given the ``L`` tokens before it.

Contenders, timed round-robin in one run (medians after warm-up):

* ``mha_no_cache``: ``MultiHeadAttention`` recomputes the whole prefix: projections of
  ``L + 1`` tokens and causal attention over them, keeping the last row. This is what
  decoding costs without a cache: every step repeats all the work of the previous one.
* ``mha_cache``: the same module with a ``KVCache`` holding the ``L`` earlier keys and
  values: one token is projected, appended and attends to ``L + 1`` keys.
* ``mla_no_cache``: ``MultiHeadLatentAttention`` (kv_lora_rank 128, 64 + 32 query/key
  dims, values of 64: a scaled-down DeepSeek-V3 shape) on the whole prefix.
* ``mla_materialised``: MLA with a ``LatentKVCache``, ``absorb=False``: each step
  up-projects all ``L + 1`` cached latents into per-head keys and values again.
* ``mla_absorbed``: MLA with the same cache, ``absorb=True``: the up-projections are
  folded into the query and the output, and the step attends to the latents directly.

Each cached contender is checked against its no-cache output before timing. The cache
bytes per token (fp32, this one layer) are saved beside the times. Prints ratios and
saves ``src/attention/benchmark_results/decode.json``.

Two clocks, read around the same calls in one interleaved loop: wall time
(``time.perf_counter``) and the thread's CPU time (``time.thread_time``). With one
intra-op thread every operation runs on the calling thread, so the CPU time is the work
done; on a machine shared with other jobs the wall time also counts the time spent
waiting for a core, which inflates the longer calls more than the shorter ones. The
ratios are computed from the CPU time; both are saved.

Keys: ``stamp``, ``setting``, ``load_average`` ([before, after]),
``cache_bytes_per_token``, ``contexts``, ``clock``, ``median_cpu_s``, ``median_wall_s``,
``ratios``, as before; added: ``median_cpu_s_q1``, ``median_cpu_s_q3``,
``median_wall_s_q1``, ``median_wall_s_q3`` (interquartile ranges, the layout of the
medians), ``ratios_separated`` (per context and ratio: the two contenders' CPU-time
interquartile ranges do not overlap), ``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/decode.py`` (about a minute on a quiet machine).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import (
    THREADS,
    agree,
    begin,
    by_point,
    finish,
    protocol_config,
    ratio,
    separated_at,
    sweep,
)

from attention import MultiHeadAttention, MultiHeadLatentAttention

ORDER = 90  # place in run_all.py's session
EMBED, HEADS = 512, 8
MLA_DIMS = dict(
    kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64
)
CONTEXTS, QUICK_CONTEXTS = [128, 256, 512, 1024, 2048], [32, 64]
WARMUP, REPEAT = 1, 15
RATIOS = {  # name: (numerator, denominator), on the thread's CPU time
    "mha_no_cache / mha_cache": ("mha_no_cache", "mha_cache"),
    "mla_no_cache / mla_absorbed": ("mla_no_cache", "mla_absorbed"),
    "mla_materialised / mla_absorbed": ("mla_materialised", "mla_absorbed"),
    "mla_absorbed / mha_cache": ("mla_absorbed", "mha_cache"),
}


def contenders(length: int, mha, mla, x) -> dict:
    """Zero-argument callables for one context length; each returns the new token's
    output."""
    prefix = x[:, : length + 1]  # (1, L + 1, E)
    new = x[:, length : length + 1]  # (1, 1, E)
    kv = mha.new_cache(1, length + 1)
    latent = mla.new_cache(1, length + 1)
    with torch.inference_mode():
        mha(x[:, :length], x[:, :length], x[:, :length], is_causal=True, cache=kv)
        mla(x[:, :length], cache=latent)

    def mha_cache():
        kv.length = length  # drop the previous step's token: every call decodes L + 1
        return mha(new, new, new, is_causal=True, cache=kv)[0]

    def mla_step(absorb):
        def step():
            latent.length = length
            return mla(new, cache=latent, absorb=absorb)[0]

        return step

    return {
        "mha_no_cache": lambda: mha(prefix, prefix, prefix, is_causal=True)[0][:, -1:],
        "mha_cache": mha_cache,
        "mla_no_cache": lambda: mla(prefix)[0][:, -1:],
        "mla_materialised": mla_step(False),
        "mla_absorbed": mla_step(True),
    }


def main() -> None:
    run = begin("decode")
    torch.set_num_threads(THREADS)
    contexts = QUICK_CONTEXTS if run.quick else CONTEXTS
    repeat = run.repeat if run.quick else REPEAT
    torch.manual_seed(0)
    mha = MultiHeadAttention(EMBED, HEADS).eval()
    mla = MultiHeadLatentAttention(EMBED, HEADS, **MLA_DIMS).eval()
    x = torch.randn(1, max(contexts) + 1, EMBED)
    checks = [
        agree("mha_no_cache", "mha_cache", atol=1e-4),
        agree("mla_no_cache", "mla_materialised", "mla_absorbed", atol=1e-4),
    ]
    result = sweep(
        run,
        contexts,
        lambda n: contenders(n, mha, mla, x),
        check=checks,
        warmup=WARMUP,
        repeat=repeat,
        clocks="wall+cpu",
        label="L",
    )
    ratios = {k: ratio(result, a, b, key="cpu_s") for k, (a, b) in RATIOS.items()}
    resolved = {k: separated_at(result, a, b, "cpu_s") for k, (a, b) in RATIOS.items()}
    setting = protocol_config(
        run,
        batch=1,
        embed_dim=EMBED,
        num_heads=HEADS,
        mha_head_dim=EMBED // HEADS,
        mla=MLA_DIMS,
        dtype="float32",
        mode="one decode step, forward, inference_mode",
        warmup=WARMUP + 1,
        repeat=repeat,
    )
    clock = "ratios and median_cpu_s: time.thread_time of the one compute thread"
    data = {"setting": setting, "load_average": None}  # load: filled by finish
    data["cache_bytes_per_token"] = {
        "mha": mha.new_cache(1, 1).nbytes,  # keys and values of 8 heads of 64, fp32
        "mla": mla.new_cache(1, 1).nbytes,  # latent 128 + rotary key 32, fp32
    }
    data |= {"contexts": contexts, "clock": clock}
    for name, key in (("cpu", "cpu_s"), ("wall", "time_s")):
        for suffix in ("", "_q1", "_q3"):
            medians = result[key + suffix]
            data[f"median_{name}_s{suffix}"] = by_point(medians, contexts)
    data["ratios"] = by_point(ratios, contexts)
    data["ratios_separated"] = by_point(resolved, contexts)
    finish(run, data, repeat=repeat)


if __name__ == "__main__":
    main()
