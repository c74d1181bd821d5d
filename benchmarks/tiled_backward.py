"""Training memory of exact attention: forward + backward, three ways (chapter 14).

Contenders, fp32, batch 1, 4 heads, d = e = 64, non-causal, blocks of 256 keys:

* ``naive``: ``attention.scaled_dot_product_attention`` under autograd, which keeps the
  ``(h, N, N)`` scores and weights for the backward pass;
* ``tiled_autograd``: the tiled forward recurrence of chapter 13 written with ordinary
  tensor operations, so autograd differentiates through it and keeps every tile;
* ``tiled``: ``attention.tiled_attention``, whose backward recomputes each tile from the
  saved log-sum-exp and keeps only q, k, v, the output and the log-sum-exp.

Each call is the forward pass and ``torch.autograd.grad`` of a weighted sum of the output
with respect to q, k and v. Peak memory (extra resident memory of one call) is measured
in a fresh subprocess per contender and length (``_common.peak_memory_mib``); times are
medians of round-robin runs, one thread, on a shared machine: read them as rough ratios.
Saves ``src/attention/benchmark_results/tiled_backward.json``.

Run: ``.venv/bin/python benchmarks/tiled_backward.py`` (a few minutes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Passive OpenMP waiting, as in the other benchmarks (see benchmarks/tiled.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_times, peak_memory_mib, save_results, stamp  # noqa: E402

from attention import scaled_dot_product_attention, tiled_attention  # noqa: E402

THREADS = 1
HEADS, DIM, BLOCK = 4, 64, 256
SIZES = [512, 1024, 2048, 4096, 8192]
TIMED_SIZES = [512, 1024, 2048, 4096]  # the naive form at 8192 takes tens of seconds a call
CONTENDERS = ["naive", "tiled_autograd", "tiled"]


def tiled_autograd(q, k, v, block_size=BLOCK):
    """Chapter 13's recurrence in plain differentiable operations: autograd keeps every tile."""
    scale = q.shape[-1] ** -0.5
    n = k.shape[-2]
    m = torch.full((*q.shape[:-1], 1), float("-inf"))
    l = torch.zeros((*q.shape[:-1], 1))  # noqa: E741
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]))
    for j0 in range(0, n, block_size):
        s = q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1) * scale  # (b, h, N, block)
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
        acc = acc * alpha + p @ v[..., j0 : j0 + block_size, :]
        m = m_new
    return acc / l


FUNCTIONS = {
    "naive": scaled_dot_product_attention,
    "tiled_autograd": tiled_autograd,
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=BLOCK),
}


def _prepared(name: str, n: int):
    """A zero-argument call: forward and backward of one contender on inputs of length n."""
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, HEADS, n, DIM, generator=g).requires_grad_() for _ in range(3))
    weight = torch.randn(1, HEADS, n, DIM, generator=g)
    fn = FUNCTIONS[name]

    def run():
        # The probe and the timer run calls under inference_mode; training needs autograd.
        with torch.inference_mode(False), torch.enable_grad():
            out = fn(q, k, v)
            return torch.autograd.grad((out * weight).sum(), (q, k, v))

    return run


def make_naive(n: int):
    return _prepared("naive", n)


def make_tiled_autograd(n: int):
    return _prepared("tiled_autograd", n)


def make_tiled(n: int):
    return _prepared("tiled", n)


def main() -> None:
    torch.set_num_threads(THREADS)
    load_before = os.getloadavg()[0]
    # Memory first: a probe inherits this parent's peak through exec, so measure before
    # any large tensor exists here.
    peak = {}
    for name in CONTENDERS:
        peak[name] = []
        for n in SIZES:
            peak[name].append(peak_memory_mib(f"tiled_backward:make_{name}", n=n))
            print(f"{name:>15} N = {n:>5}: {peak[name][-1]:9.1f} MiB", flush=True)
    times = {name: [] for name in CONTENDERS}
    for n in TIMED_SIZES:
        t = interleaved_times({name: _prepared(name, n) for name in CONTENDERS}, warmup=1,
                              repeat=5 if n <= 2048 else 3)  # fmt: skip
        for name in CONTENDERS:
            times[name].append(t[name])
        print(f"N = {n:>5}: " + "  ".join(f"{name} {1e3 * t[name]:8.1f} ms" for name in CONTENDERS), flush=True)
    i = SIZES.index(8192)
    ratio = peak["tiled"][i] / peak["naive"][i]
    print(f"N = 8192: the recomputing backward's peak is {ratio:.4f} of naive autograd's (1/{1 / ratio:.0f})")
    path = save_results(
        "tiled_backward",
        {
            "stamp": stamp(THREADS),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "block_size": BLOCK,
                "is_causal": False,
                "memory_threads": 1,
                "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
                "call": "forward + autograd.grad with respect to q, k, v",
            },
            "n": SIZES,
            "peak_mib": peak,
            "timed_n": TIMED_SIZES,
            "time_s": times,
            "memory_ratio_8192": {name: peak[name][i] / peak["naive"][i] for name in CONTENDERS},
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
