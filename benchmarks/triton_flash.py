"""The FlashAttention-2 Triton kernel against PyTorch's fused SDPA on a CUDA GPU
(chapter 16).

A full run needs a CUDA device (``--device cuda``, the default where one is present);
without one it exits with status 4, which ``run_all.py`` reports as skipped. On a CPU
the kernel runs under Triton's interpreter, which is for correctness, not speed: there
``--quick`` (tiny sizes) only checks that the script runs. For each sequence length it

1. checks correctness by flash-attn's rule, in float16 and bfloat16 (the interpreter
   has no bfloat16: ``None`` there): against a float64 reference, the kernel's largest
   error is at most twice the error of PyTorch's own SDPA in the same precision
   (forward output and the three gradients). float32 is checked the same way: on NVIDIA
   GPUs ``tl.dot`` multiplies float32 inputs in TF32 (10-bit mantissas) unless the
   kernel asks for ``input_precision="ieee"``, and an error near 1e-3 where PyTorch's
   is near 1e-6 shows TF32 at work (``torch.backends.cuda.matmul.allow_tf32``, saved
   in ``config``, governs PyTorch's matmuls, not Triton's);
2. times the forward and the forward + backward of both contenders in float16 (no TF32
   question there), interleaved under the protocol of ``_common`` (round-robin, so a
   slow spell hits all alike; ``REPEAT`` timed runs after ``WARMUP``). On a GPU each
   call is timed with two CUDA events, the device synchronised before and after it
   (a launch returns before the GPU has finished); the median and the interquartile
   range are saved in milliseconds.

Saved to ``src/attention/benchmark_results/triton_flash.json``: ``stamp`` (the
protocol's, plus ``device``, ``gpu``, ``cuda`` and ``triton``), ``quiet``, ``config``
(b, h, d, timed dtype, causal, device, TF32 flag), ``n`` (lengths), ``error`` (per
dtype and length: ours and torch's largest error for out, dq, dk, dv, and whether the
rule holds), and ``time_ms`` (per contender and pass, ``triton_forward``,
``sdpa_forward``, ``triton_forward_backward``, ``sdpa_forward_backward``: ``median``,
``q1``, ``q3`` lists over ``n``).

Run: ``python benchmarks/triton_flash.py`` on a machine with a CUDA GPU (a few minutes).
"""

from __future__ import annotations

import os

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
import torch.nn.functional as F
from _common import THREADS, begin, finish, protocol_config, sweep

ORDER = 120  # place in run_all.py's session: last, as it needs a CUDA device
B, H, D = 4, 16, 64
LENGTHS = [512, 1024, 2048, 4096, 8192]
ERROR_LENGTHS = LENGTHS[:3]
QUICK = {"b": 1, "h": 1, "d": 16, "lengths": [32]}  # under the CPU interpreter
WARMUP, REPEAT = 5, 21
GRADS = ("out", "dq", "dk", "dv")  # the output and the three gradients


def errors(attend, shape, dtype, causal: bool, device) -> dict:
    """Largest error of ``attend`` and of torch's SDPA in ``dtype`` against a float64
    reference, for the output and the three gradients."""
    gen = torch.Generator(device=device).manual_seed(shape[2])
    f64 = {"device": device, "dtype": torch.float64, "generator": gen}
    q, k, v, upstream = (torch.randn(shape, **f64) for _ in range(4))

    def run(fn, tensors):
        tensors = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*tensors, is_causal=causal)
        grads = torch.autograd.grad(out, tensors, upstream.to(out.dtype))
        return [out.double(), *(g.double() for g in grads)]

    reference = run(F.scaled_dot_product_attention, (q, k, v))
    low = [t.to(dtype) for t in (q, k, v)]
    ours, torchs = run(attend, low), run(F.scaled_dot_product_attention, low)
    result = {}
    for name, r, a, b in zip(GRADS, reference, ours, torchs):
        mine, theirs = (a - r).abs().max().item(), (b - r).abs().max().item()
        result[name] = {
            "ours": mine,
            "torch": theirs,
            "within_rule": mine <= 2 * theirs,
        }
    return result


def contenders(attend, shape, causal: bool, device):
    """Zero-argument callables at one length: forward, and forward + backward."""
    f16 = {"device": device, "dtype": torch.float16}
    q, k, v = (torch.randn(shape, **f16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, **f16)

    def forward():
        return attend(q, k, v, is_causal=causal)

    def forward_backward():
        # the timer runs calls under inference_mode; training needs autograd
        with torch.inference_mode(False), torch.enable_grad():
            out = attend(q, k, v, is_causal=causal)
            return torch.autograd.grad(out, (q, k, v), grad)

    return {"forward": forward, "forward_backward": forward_backward}


def main() -> None:
    default = "cuda" if torch.cuda.is_available() else "cpu"
    run = begin(
        "triton_flash",
        options=lambda p: p.add_argument("--device", default=default),
    )
    device = torch.device(run.args.device)
    if device.type == "cpu" and not run.quick:
        print("triton_flash: needs a CUDA device (on a CPU, --quick only)")
        raise SystemExit(4)
    if device.type == "cpu":  # before Triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton

    from attention.efficient.triton_flash import flash_attention_triton as triton_fa

    torch.set_num_threads(THREADS)
    q = QUICK if run.quick else {"b": B, "h": H, "d": D, "lengths": LENGTHS}
    lengths, causal = q["lengths"], True

    def shape(n: int) -> tuple[int, ...]:
        return (q["b"], q["h"], n, q["d"])

    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    error = {}
    for dt in dtypes:
        runs_here = device.type == "cuda" or dt != torch.bfloat16
        error[str(dt).removeprefix("torch.")] = {
            str(n): errors(triton_fa, shape(n), dt, causal, device)
            if runs_here
            else {g: dict.fromkeys(("ours", "torch", "within_rule")) for g in GRADS}
            for n in (lengths if run.quick else ERROR_LENGTHS)
        }

    def both(n):
        pairs = (("triton", triton_fa), ("sdpa", F.scaled_dot_product_attention))
        return {
            f"{name}_{label}": fn
            for name, attend in pairs
            for label, fn in contenders(attend, shape(n), causal, device).items()
        }

    result = sweep(
        run,
        lengths,
        both,
        warmup=1 if run.quick else WARMUP,
        repeat=run.repeat if run.quick else REPEAT,
        device=device,
    )
    time_ms = {
        name: {
            stat: [1e3 * t for t in result[f"time_s{suffix}"][name]]
            for stat, suffix in (("median", ""), ("q1", "_q1"), ("q3", "_q3"))
        }
        for name in result["time_s"]
    }
    config = protocol_config(
        run,
        b=q["b"],
        h=q["h"],
        d=q["d"],
        dtype=str(torch.float16),
        causal=causal,
        device=str(device),
        allow_tf32=torch.backends.cuda.matmul.allow_tf32,
        warmup=1 if run.quick else WARMUP,
        repeat=run.repeat if run.quick else REPEAT,
    )
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    finish(
        run,
        {"config": config, "n": lengths, "error": error, "time_ms": time_ms},
        repeat=config["repeat"],
        extra_stamp={
            "device": str(device),
            "gpu": gpu,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
        },
    )


if __name__ == "__main__":
    main()
