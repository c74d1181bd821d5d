"""Training memory and time of exact attention: forward + backward, five ways
(chapter 15).

Contenders, fp32, batch 1, 4 heads, d = e = 64, non-causal, blocks of 256 keys:

* ``naive``: ``attention.scaled_dot_product_attention`` under autograd, which keeps the
  ``(h, N, N)`` scores and weights for the backward pass;
* ``tiled_autograd``: the tiled forward recurrence of chapter 14 written with ordinary
  tensor operations, so autograd differentiates through it and keeps every tile;
* ``tiled``: ``attention.tiled_attention``, whose backward recomputes each tile from the
  saved log-sum-exp (FlashAttention-2) and keeps only q, k, v, the output and the
  log-sum-exp;
* ``stored_p``: the same tiled forward and backward, except that the forward keeps every
  tile of the weights P (``(h, N, N)`` in all) and the backward reads them instead of
  recomputing ``Q K^T`` and the exponential: what recomputation saves in memory and
  costs in time;
* ``sdpa``: PyTorch's fused ``torch.nn.functional.scaled_dot_product_attention`` forward
  and backward (its flash CPU kernel, which also recomputes): the strongest baseline.

Each call is the forward pass and ``torch.autograd.grad`` of a weighted sum of the
output with respect to q, k and v. Peak memory (extra resident memory of one call) is
measured in a fresh subprocess per contender and length (``_common.peak_memory_mib``);
times under the protocol of ``_common`` (one thread, passive OpenMP waiting,
interleaved, >= 7 repeats after warm-up, median and quartiles).

The cost of recomputation is measured apart, with more repeats (``RECOMPUTE_REPEAT``) at
``RECOMPUTE_N``: ``tiled`` against ``stored_p``, forward + backward and backward alone
(the backward of one graph built outside the timed call, run with ``retain_graph``).

Keys: ``n``, ``peak_mib`` ``{naive, tiled_autograd, tiled}``, ``timed_n``, ``time_s``,
``memory_ratio_8192``, ``load_average``, ``config``, as before; ``peak_mib``, ``time_s``
and ``memory_ratio_8192`` now also hold ``stored_p`` and ``sdpa``. Added: ``time_s_q1``,
``time_s_q3`` (interquartile range, the layout of ``time_s``); ``recompute``: ``n``,
``repeat``, ``forward_backward`` and ``backward`` (each ``{tiled, stored_p}`` ->
``{median, q1, q3}`` in seconds), ``cost_forward_backward`` and ``cost_backward`` (tiled
/ stored_p medians - 1: the fraction recomputation adds), ``*_separated`` (the two
interquartile ranges do not overlap); ``stamp`` and ``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/tiled_backward.py`` (about two and a half minutes on
a quiet machine, most of it the memory probes at N = 8192: the naive form's call alone
takes about 12 s of CPU there).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
import torch.nn.functional as F
from _common import (
    MEMORY_THREADS,
    THREADS,
    begin,
    finish,
    interleaved_samples,
    peak_memories,
    protocol_config,
    quartiles,
    separated,
    sweep,
)
from torch.autograd.function import once_differentiable

from attention import scaled_dot_product_attention, tiled_attention

ORDER = 40  # place in run_all.py's session
HEADS, DIM, BLOCK = 4, 64, 256
SIZES = [512, 1024, 2048, 4096, 8192]
TIMED_SIZES = [512, 1024, 2048]  # the naive form at 4096 takes seconds a call
CONTENDERS = ["naive", "tiled_autograd", "tiled", "stored_p", "sdpa"]
RECOMPUTE_N, RECOMPUTE_REPEAT = 2048, 21
QUICK_SIZES, QUICK_RECOMPUTE_N = [64, 128], 128


def tiled_autograd(q, k, v, block_size=BLOCK):
    """Chapter 14's recurrence in plain differentiable operations: autograd keeps every
    tile."""
    scale = q.shape[-1] ** -0.5
    n = k.shape[-2]
    m = torch.full((*q.shape[:-1], 1), float("-inf"))
    l = torch.zeros((*q.shape[:-1], 1))  # noqa: E741
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]))
    for j0 in range(0, n, block_size):
        s = (
            q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1) * scale
        )  # (b, h, N, block)
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
        acc = acc * alpha + p @ v[..., j0 : j0 + block_size, :]
        m = m_new
    return acc / l


class _StoredP(torch.autograd.Function):
    """Tiled attention (non-causal, no mask) whose backward reads the stored weights P.

    The forward is the online-softmax recurrence of ``attention.efficient.tiled``; it
    keeps each exponentiated tile ``exp(S_j - m_j)`` and its running max ``m_j``, and at
    the end rescales them in place to ``P_j = exp(S_j - lse)`` (one multiply by a
    per-row factor: no second pass of exponentials). The backward is
    ``attention.efficient.tiled``'s, minus the recomputation of ``S_j = Q K_j^T s`` and
    ``exp``.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_size):
        scale = q.shape[-1] ** -0.5
        n = k.shape[-2]
        m = torch.full((*q.shape[:-1], 1), float("-inf"))
        l = torch.zeros((*q.shape[:-1], 1))  # noqa: E741
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]))
        tiles, maxima = [], []
        for j0 in range(0, n, block_size):
            s = (q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1)).mul_(
                scale
            )  # (b, h, N, blk)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha = torch.exp(m - m_new)
            p = s.sub_(m_new).exp_()  # in place, as attention.efficient.tiled does
            l = l * alpha + p.sum(dim=-1, keepdim=True)  # noqa: E741
            acc = acc * alpha + p @ v[..., j0 : j0 + block_size, :]
            m = m_new
            tiles.append(p)
            maxima.append(m_new)
        lse = m + torch.log(l)  # (b, h, N, 1)
        for p, mj in zip(tiles, maxima, strict=True):
            p.mul_(torch.exp(mj - lse))  # P_j = exp(S_j - lse)
        out = acc / l
        ctx.save_for_backward(q, k, v, out, *tiles)
        ctx.block_size = block_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, *tiles = ctx.saved_tensors
        scale, blk = q.shape[-1] ** -0.5, ctx.block_size
        delta = (dout * out).sum(dim=-1, keepdim=True)  # (b, h, N, 1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for t, p in enumerate(tiles):
            j0, j1 = t * blk, min((t + 1) * blk, k.shape[-2])
            dv[..., j0:j1, :] = p.transpose(-2, -1) @ dout
            ds = (
                (dout @ v[..., j0:j1, :].transpose(-2, -1)).sub_(delta).mul_(p)
            )  # dS = P (dP - D)
            dq += (ds @ k[..., j0:j1, :]) * scale
            dk[..., j0:j1, :] = (ds.transpose(-2, -1) @ q) * scale
        return dq, dk, dv, None


def stored_p(q, k, v):
    return _StoredP.apply(q, k, v, BLOCK)


FUNCTIONS = {
    "naive": scaled_dot_product_attention,
    "tiled_autograd": tiled_autograd,
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=BLOCK),
    "stored_p": stored_p,
    "sdpa": F.scaled_dot_product_attention,
}


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    q, k, v = (
        torch.randn(1, HEADS, n, DIM, generator=g).requires_grad_() for _ in range(3)
    )
    weight = torch.randn(1, HEADS, n, DIM, generator=g)
    return q, k, v, weight


def _prepared(name: str, n: int):
    """A zero-argument call: forward and backward of one contender on inputs of length
    n."""
    q, k, v, weight = _inputs(n)
    fn = FUNCTIONS[name]

    def run():
        # The probe and the timer run calls under inference_mode; training needs
        # autograd.
        with torch.inference_mode(False), torch.enable_grad():
            out = fn(q, k, v)
            return torch.autograd.grad((out * weight).sum(), (q, k, v))

    return run


def _backward_only(name: str, n: int):
    """A zero-argument call: the backward alone, of one graph built here
    (retain_graph)."""
    q, k, v, weight = _inputs(n)
    with torch.inference_mode(False), torch.enable_grad():
        loss = (FUNCTIONS[name](q, k, v) * weight).sum()

    def run():
        with torch.inference_mode(False), torch.enable_grad():
            return torch.autograd.grad(loss, (q, k, v), retain_graph=True)

    return run


def make_naive(n: int):
    return _prepared("naive", n)


def make_tiled_autograd(n: int):
    return _prepared("tiled_autograd", n)


def make_tiled(n: int):
    return _prepared("tiled", n)


def make_stored_p(n: int):
    return _prepared("stored_p", n)


def make_sdpa(n: int):
    return _prepared("sdpa", n)


MAKERS = {name: globals()[f"make_{name}"] for name in CONTENDERS}


def _check(n: int = 2 * BLOCK) -> None:
    """Every contender's gradients agree with the naive form's before anything is
    timed."""
    ref = _prepared("naive", n)()
    for name in CONTENDERS[1:]:
        got = _prepared(name, n)()
        diff = max(float((a - b).abs().max()) for a, b in zip(got, ref, strict=True))
        assert diff < 1e-4, f"{name}: gradients differ from the naive form's by {diff}"


def recomputation(run, n: int, repeat: int) -> dict:
    """The cost of recomputation, resolved with more repeats: forward + backward and
    the backward alone, tiled (recomputes) against stored_p (reads P)."""
    pair = ("tiled", "stored_p")
    fb, bw = (
        interleaved_samples({k: make(k, n) for k in pair}, warmup=2, repeat=repeat)
        for make in (_prepared, _backward_only)
    )
    fb, bw = ({k: quartiles(v) for k, v in d.items()} for d in (fb, bw))
    cost = {}
    for label, st in (("forward_backward", fb), ("backward", bw)):
        cost[f"cost_{label}"] = st["tiled"]["median"] / st["stored_p"]["median"] - 1
        cost[f"cost_{label}_separated"] = separated(st["tiled"], st["stored_p"])
    print(f"N = {n}, {repeat} repeats: recomputation adds {cost}")
    return {"n": n, "repeat": repeat, "forward_backward": fb, "backward": bw, **cost}


def main() -> None:
    run = begin("tiled_backward")
    torch.set_num_threads(THREADS)
    sizes, timed = (QUICK_SIZES, QUICK_SIZES) if run.quick else (SIZES, TIMED_SIZES)
    # Memory first: a probe is measured before any large tensor exists in this parent.
    peak = peak_memories(run, MAKERS, sizes)
    _check()
    result = sweep(run, timed, MAKERS, warmup=1)
    recompute = recomputation(
        run,
        QUICK_RECOMPUTE_N if run.quick else RECOMPUTE_N,
        run.repeat if run.quick else RECOMPUTE_REPEAT,
    )
    config = protocol_config(
        run,
        memory_threads=MEMORY_THREADS,
        batch=1,
        heads=HEADS,
        d=DIM,
        dtype="float32",
        block_size=BLOCK,
        is_causal=False,
        call="forward + autograd.grad with respect to q, k, v",
    )
    largest = peak["naive"][-1]
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": config,
            "n": sizes,
            "peak_mib": peak,
            "timed_n": timed,
            **result,
            # at the largest size (8192 in a full run)
            "memory_ratio_8192": {
                k: v[-1] / largest if largest else None for k, v in peak.items()
            },
            "recompute": recompute,
        },
    )


if __name__ == "__main__":
    main()
