"""Local (local-p) alignment: is its cost per query O(D), as claimed? (chapter 9)

Luong et al.'s local-p attention weighs only the ``2D + 1`` source positions around a
predicted centre ``p_i``. The package's ``local_alignment`` takes the full ``(i, S)``
scores and zeroes everything outside the window (clear, differentiable, but O(S) per
query); the claim "O(D) per query" holds for a form that computes only the window's
scores. Both are timed here, with global soft attention for scale:

* ``local_dense``: scores ``q K^T`` for all S positions,
  ``attention.layers.alignment.local_alignment``, weights @ values: O(S) per query;
* ``local_gathered``: the window's keys and values gathered per query
  (``2D + 1`` rows from ``ceil(p - D)``), scores, softmax over the window, the Gaussian
  ``exp(-(l - p)^2 / (2 sigma^2))``, weighted sum: O(D) per query; checked equal to
  ``local_dense`` before timing;
* ``global``: softmax over all S positions
  (``torch.nn.functional.scaled_dot_product_attention`` with scale 1, Luong's dot
  score).

Batch 16, 32 queries, d = e = 128, fp32, centres from
``attention.layers.alignment.local_centre`` (fixed random predictor), under the protocol
of ``_common`` (one thread, passive OpenMP waiting, contenders interleaved, >= 7 repeats
after warm-up, median and quartiles).
Two sweeps: S = 256 ... 16384 at D = 8, and D = 2 ... 128 at S = 4096.

Saved keys: ``vs_source_length`` (``S``, ``D``, and ``time_s``, ``time_s_q1``,
``time_s_q3`` as ``{contender: [per S]}``, ``per_query_s`` = median / (batch x queries),
``slope_time`` ``{contender: log-log slope in S}``: about 0 for O(D), 1 for O(S));
``vs_half_width`` (the same with ``D`` a list and ``S`` fixed, ``slope_time`` in D);
``config``; ``stamp``, ``quiet`` (``_common``).

Run: ``.venv/bin/python benchmarks/alignment.py`` (about twenty seconds on a quiet
machine).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import THREADS, agree, begin, finish, fit_slope, protocol_config, sweep

from attention.layers.alignment import local_alignment, local_centre

ORDER = 70  # place in run_all.py's session
BATCH, QUERIES, DIM, HIDDEN = 16, 32, 128, 64
S_SWEEP, D_FIXED = [256, 1024, 4096, 16384], 8
D_SWEEP, S_FIXED = [2, 8, 32, 128], 4096


def local_gathered(q, keys, values, centre, half_width: int, sigma: float):
    """Local-p attention reading only the 2D + 1 positions around each centre: O(D)
    per query.

    q ``(b, i, d)``, keys ``(b, S, d)``, values ``(b, S, e)``, centre ``(b, i)``;
    returns ``(b, i, e)``.
    """
    b, s = keys.shape[0], keys.shape[1]
    width = 2 * half_width + 1
    start = torch.ceil(centre - half_width).long().unsqueeze(-1)  # (b, i, 1)
    pos = start + torch.arange(width)  # (b, i, W)
    valid = (pos >= 0) & (pos < s) & ((pos - centre.unsqueeze(-1)).abs() <= half_width)
    idx = pos.clamp(0, s - 1)
    rows = torch.arange(b).view(b, 1, 1)
    k, v = keys[rows, idx], values[rows, idx]  # (b, i, W, d), (b, i, W, e)
    scores = (k @ q.unsqueeze(-1)).squeeze(-1)  # (b, i, W)
    weights = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
    z = torch.where(valid, (pos - centre.unsqueeze(-1)) / sigma, 0.0)
    weights = weights * torch.exp(-0.5 * z**2)
    return (weights.unsqueeze(-2) @ v).squeeze(-2)  # (b, i, e)


def contenders(point: tuple[int, int]) -> dict:
    """The three forms at source length S and half-width D, on the same inputs."""
    s, half_width = point
    g = torch.Generator().manual_seed(s + half_width)
    q = torch.randn(BATCH, QUERIES, DIM, generator=g)
    keys, values = (torch.randn(BATCH, s, DIM, generator=g) for _ in range(2))
    w_p = torch.randn(HIDDEN, DIM, generator=g) / DIM**0.5
    v_p = torch.randn(HIDDEN, generator=g)
    sigma = half_width / 2

    def centre():
        return local_centre(q, w_p, v_p, s)  # (b, i), part of both local forms' cost

    def dense():
        scores = q @ keys.transpose(-2, -1)  # (b, i, S)
        weights = local_alignment(scores, centre(), float(half_width), sigma=sigma)
        return weights @ values

    def gathered():
        return local_gathered(q, keys, values, centre(), half_width, sigma)

    def softmax():
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return sdpa(q, keys, values, scale=1.0)

    return {"local_dense": dense, "local_gathered": gathered, "global": softmax}


def by(run, points, vary: str) -> dict:
    """One sweep over S (``vary="S"``, D fixed) or over D (S fixed)."""
    result = sweep(
        run,
        points,
        contenders,
        label="S, D",
        check=agree("local_dense", "local_gathered", atol=1e-4),
    )
    xs = [p[0] if vary == "S" else p[1] for p in points]
    per_query = {
        name: [t / (BATCH * QUERIES) for t in ts]
        for name, ts in result["time_s"].items()
    }
    return {
        "S": xs if vary == "S" else S_FIXED,
        "D": D_FIXED if vary == "S" else xs,
        **result,
        "per_query_s": per_query,
        "slope_time": fit_slope(xs, result["time_s"]),
    }


def main() -> None:
    run = begin("alignment")
    torch.set_num_threads(THREADS)
    s_sweep, d_sweep = ([256, 1024], [2, 8]) if run.quick else (S_SWEEP, D_SWEEP)
    by_s = by(run, [(s, D_FIXED) for s in s_sweep], "S")
    by_d = by(run, [(S_FIXED, d) for d in d_sweep], "D")
    config = protocol_config(
        run,
        batch=BATCH,
        queries=QUERIES,
        d=DIM,
        e=DIM,
        predictor_hidden=HIDDEN,
        sigma="D / 2",
        score="dot product, unscaled",
        dtype="float32",
    )
    finish(run, {"config": config, "vs_source_length": by_s, "vs_half_width": by_d})


if __name__ == "__main__":
    main()
