"""The FlashAttention-2 Triton kernel against PyTorch's fused SDPA on a CUDA GPU (chapter 16).

Runs only where a CUDA device is present (it refuses otherwise: on a CPU the kernel runs
under Triton's interpreter, which is for correctness, not speed). For each sequence length
it

1. checks correctness in float16 and bfloat16 by flash-attn's rule: against a float32
   reference, the kernel's largest error is at most twice the error of PyTorch's own SDPA
   in the same half precision (forward output and the three gradients);
2. times forward and forward+backward of both contenders, interleaved (round-robin, so a
   slow spell hits both alike), ``REPEAT`` timed runs after ``WARMUP`` runs, each timed with
   CUDA events, and saves the median and the interquartile range (q1, q3) in milliseconds.

Saved to ``src/attention/benchmark_results/triton_flash.json``:
``stamp`` (GPU name, CUDA and torch versions, Triton version, date), ``config`` (b, h, d,
dtype, causal), ``n`` (lengths), ``error`` (per dtype and length: ours and torch's max error
for out, dq, dk, dv, and whether the rule holds), and ``time_ms`` (per contender and pass:
``median``, ``q1``, ``q3`` lists over ``n``).

    python benchmarks/triton_flash.py
"""

from __future__ import annotations

import datetime as _dt
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from _common import save_results, set_omp_wait_policy  # noqa: E402

# The timed work runs on the GPU; OpenMP's default policy is recorded in the JSON.
POLICY = set_omp_wait_policy("default")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

B, H, D = 4, 16, 64
LENGTHS = [512, 1024, 2048, 4096, 8192]
WARMUP, REPEAT = 5, 21


def _quartiles(samples):
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return median, q1, q3


def _errors(fn, n, dtype, causal):
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, device="cuda", generator=gen) for _ in range(3))
    upstream = torch.randn(B, H, n, D, device="cuda", generator=gen)

    def run(attend, tensors):
        tensors = [t.detach().clone().requires_grad_() for t in tensors]
        out = attend(*tensors, is_causal=causal)
        grads = torch.autograd.grad(out, tensors, upstream.to(out.dtype))
        return [out.float(), *(g.float() for g in grads)]

    reference = run(F.scaled_dot_product_attention, (q, k, v))
    half = [t.to(dtype) for t in (q, k, v)]
    ours = run(fn, half)
    torchs = run(F.scaled_dot_product_attention, half)
    names = ("out", "dq", "dk", "dv")
    result = {}
    for name, r, a, b in zip(names, reference, ours, torchs):
        mine, theirs = (a - r).abs().max().item(), (b - r).abs().max().item()
        result[name] = {
            "ours": mine,
            "torch": theirs,
            "within_rule": mine <= 2 * theirs,
        }
    return result


def _time(fns):
    """Interleaved CUDA-event timings (ms) of several zero-argument callables."""
    for _ in range(WARMUP):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(REPEAT):
        for name, fn in fns.items():
            start, end = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end))
    return {name: _quartiles(s) for name, s in samples.items()}


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit(
            "benchmarks/triton_flash.py needs a CUDA device: on the CPU the kernel runs "
            "under Triton's interpreter, which is for correctness, not speed"
        )
    import triton

    from attention.efficient.triton_flash import flash_attention_triton

    causal, dtype = True, torch.float16
    errors = {
        str(dt).removeprefix("torch."): {
            n: _errors(flash_attention_triton, n, dt, causal) for n in LENGTHS[:3]
        }
        for dt in (torch.float16, torch.bfloat16)
    }
    times = {}
    for n in LENGTHS:
        q, k, v = (
            torch.randn(B, H, n, D, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        grad = torch.randn_like(q)

        def forward(attend, q=q, k=k, v=v):
            return lambda: attend(q, k, v, is_causal=causal)

        def training(attend, q=q, k=k, v=v, grad=grad):
            return lambda: torch.autograd.grad(
                attend(q, k, v, is_causal=causal), (q, k, v), grad
            )

        with torch.no_grad():
            fwd = _time(
                {
                    "triton": forward(flash_attention_triton),
                    "sdpa": forward(F.scaled_dot_product_attention),
                }
            )
        both = _time(
            {
                "triton": training(flash_attention_triton),
                "sdpa": training(F.scaled_dot_product_attention),
            }
        )
        for label, result in (("forward", fwd), ("forward_backward", both)):
            for name, (median, q1, q3) in result.items():
                slot = times.setdefault(
                    f"{name}_{label}", {"median": [], "q1": [], "q3": []}
                )
                slot["median"].append(median)
                slot["q1"].append(q1)
                slot["q3"].append(q3)
        print(
            f"n = {n}: "
            + ", ".join(
                f"{key} {value['median'][-1]:.3f} ms" for key, value in times.items()
            )
        )
    data = {
        "stamp": {
            "gpu": torch.cuda.get_device_name(),
            "cuda": torch.version.cuda,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date": _dt.date.today().isoformat(),
            "warmup": WARMUP,
            "repeat": REPEAT,
            "omp_wait_policy": POLICY,
        },
        "config": {"b": B, "h": H, "d": D, "dtype": str(dtype), "causal": causal},
        "n": LENGTHS,
        "error": errors,
        "time_ms": times,
    }
    print("saved", save_results("triton_flash", data))


if __name__ == "__main__":
    main()
