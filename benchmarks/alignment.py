"""Local (local-p) alignment: is its cost per query O(D), as claimed? (chapter 9)

Luong et al.'s local-p attention weighs only the ``2D + 1`` source positions around a
predicted centre ``p_i``. The package's ``local_alignment`` takes the full ``(i, S)``
scores and zeroes everything outside the window (clear, differentiable, but O(S) per
query); the claim "O(D) per query" holds for a form that computes only the window's
scores. Both are timed here, with global soft attention for scale:

* ``local_dense``: scores ``q K^T`` for all S positions, ``attention.layers.alignment.local_alignment``,
  weights @ values: O(S) per query;
* ``local_gathered``: the window's keys and values gathered per query
  (``2D + 1`` rows from ``ceil(p - D)``), scores, softmax over the window, the Gaussian
  ``exp(-(l - p)^2 / (2 sigma^2))``, weighted sum: O(D) per query; checked equal to
  ``local_dense`` before timing;
* ``global``: softmax over all S positions (``torch.nn.functional.scaled_dot_product_attention``
  with scale 1, Luong's dot score).

Batch 16, 32 queries, d = e = 128, fp32, centres from ``attention.layers.alignment.local_centre``
(fixed random predictor), under the protocol of ``_common`` (one thread, passive OpenMP
waiting, contenders interleaved, >= 7 repeats after warm-up, median and quartiles).
Two sweeps: S = 256 ... 16384 at D = 8, and D = 2 ... 128 at S = 4096.

Saved keys: ``vs_source_length`` (``S``, ``D``, and ``time_s``, ``time_s_q1``, ``time_s_q3``
as ``{contender: [per S]}``, ``per_query_s`` = median / (batch x queries), ``slope_time``
``{contender: log-log slope in S}``: about 0 for O(D), 1 for O(S)); ``vs_half_width`` (the
same with ``D`` a list and ``S`` fixed, ``slope_time`` in D); ``config``; ``stamp``,
``quiet`` (``_common``).

Run: ``.venv/bin/python benchmarks/alignment.py`` (about twenty seconds on a quiet machine).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OMP_POLICY, set_omp_wait_policy  # noqa: E402

OMP_WAIT_POLICY = set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch  # noqa: E402
from _common import MIN_REPEAT, THREADS, begin, finish, interleaved_stats, log_slope  # noqa: E402

from attention.layers.alignment import local_alignment, local_centre  # noqa: E402

BATCH, QUERIES, DIM, HIDDEN = 16, 32, 128, 64
S_SWEEP, D_FIXED = [256, 1024, 4096, 16384], 8
D_SWEEP, S_FIXED = [2, 8, 32, 128], 4096
NAMES = ("local_dense", "local_gathered", "global")


def local_gathered(q, keys, values, centre, half_width: int, sigma: float):
    """Local-p attention reading only the 2D + 1 positions around each centre: O(D) per query.

    q ``(b, i, d)``, keys ``(b, S, d)``, values ``(b, S, e)``, centre ``(b, i)``; returns ``(b, i, e)``.
    """
    b, s = keys.shape[0], keys.shape[1]
    width = 2 * half_width + 1
    pos = torch.ceil(centre - half_width).long().unsqueeze(-1) + torch.arange(
        width
    )  # (b, i, W)
    valid = (pos >= 0) & (pos < s) & ((pos - centre.unsqueeze(-1)).abs() <= half_width)
    idx = pos.clamp(0, s - 1)
    rows = torch.arange(b).view(b, 1, 1)
    k, v = keys[rows, idx], values[rows, idx]  # (b, i, W, d), (b, i, W, e)
    scores = (
        (k @ q.unsqueeze(-1)).squeeze(-1).masked_fill(~valid, float("-inf"))
    )  # (b, i, W)
    weights = torch.softmax(scores, dim=-1)
    z = torch.where(valid, (pos - centre.unsqueeze(-1)) / sigma, 0.0)
    weights = weights * torch.exp(-0.5 * z**2)
    return (weights.unsqueeze(-2) @ v).squeeze(-2)  # (b, i, e)


def contenders(s: int, half_width: int) -> dict:
    g = torch.Generator().manual_seed(s + half_width)
    q = torch.randn(BATCH, QUERIES, DIM, generator=g)
    keys, values = (torch.randn(BATCH, s, DIM, generator=g) for _ in range(2))
    w_p, v_p = (
        torch.randn(HIDDEN, DIM, generator=g) / DIM**0.5,
        torch.randn(HIDDEN, generator=g),
    )
    sigma = half_width / 2

    def centre():
        return local_centre(q, w_p, v_p, s)  # (b, i), part of both local forms' cost

    def dense():
        scores = q @ keys.transpose(-2, -1)  # (b, i, S)
        return (
            local_alignment(scores, centre(), float(half_width), sigma=sigma) @ values
        )

    return {
        "local_dense": dense,
        "local_gathered": lambda: local_gathered(
            q, keys, values, centre(), half_width, sigma
        ),
        "global": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, scale=1.0
        ),
    }


def sweep(points, *, vary: str, repeat: int) -> dict:
    med, q1, q3 = ({name: [] for name in NAMES} for _ in range(3))
    for x in points:
        s, d = (x, D_FIXED) if vary == "S" else (S_FIXED, x)
        fns = contenders(s, d)
        with torch.inference_mode():
            diff = float((fns["local_dense"]() - fns["local_gathered"]()).abs().max())
        assert diff < 1e-4, (
            f"S = {s}, D = {d}: gathered and dense local-p differ by {diff}"
        )
        t = interleaved_stats(fns, warmup=2, repeat=repeat)
        for name in NAMES:
            med[name].append(t[name]["median"])
            q1[name].append(t[name]["q1"])
            q3[name].append(t[name]["q3"])
        print(
            f"S = {s:>6}, D = {d:>4}: "
            + "  ".join(f"{n} {1e3 * t[n]['median']:8.3f} ms" for n in NAMES),
            flush=True,
        )
    return {
        "S": points if vary == "S" else S_FIXED,
        "D": D_FIXED if vary == "S" else points,
        "time_s": med,
        "time_s_q1": q1,
        "time_s_q3": q3,
        "per_query_s": {
            name: [t / (BATCH * QUERIES) for t in ts] for name, ts in med.items()
        },
        "slope_time": {name: log_slope(points, ts) for name, ts in med.items()},
    }


def main() -> None:
    run = begin("alignment")
    repeat = 3 if run.quick else MIN_REPEAT
    torch.set_num_threads(THREADS)
    by_s = sweep([256, 1024] if run.quick else S_SWEEP, vary="S", repeat=repeat)
    by_d = sweep([2, 8] if run.quick else D_SWEEP, vary="D", repeat=repeat)
    for label, res in (("S", by_s), ("D", by_d)):
        print(
            f"log-log slope in {label}: "
            + ", ".join(f"{n} {v:.2f}" for n, v in res["slope_time"].items())
        )
    finish(
        run,
        {
            "config": {
                "batch": BATCH,
                "queries": QUERIES,
                "d": DIM,
                "e": DIM,
                "predictor_hidden": HIDDEN,
                "sigma": "D / 2",
                "score": "dot product, unscaled",
                "dtype": "float32",
                "threads": THREADS,
                "omp_wait_policy": OMP_WAIT_POLICY,
                "repeat": repeat,
            },
            "vs_source_length": by_s,
            "vs_half_width": by_d,
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
