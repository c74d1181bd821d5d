"""The package's MultiHeadAttention against nn.MultiheadAttention and two baselines
(chapter 6).

Setting: batch 8, length 1024, embed 768, 12 heads (d = 64), causal self-attention,
forward only, fp32, ``torch.inference_mode()``, under the protocol of ``_common`` (one
thread, passive OpenMP waiting, contenders interleaved, >= 7 repeats, quartiles saved).

Contenders, timed round-robin in one run (medians after warm-up):

* ``package``: ``attention.MultiHeadAttention(x, x, x, is_causal=True)``
  (need_weights=False): three projections, ``split_heads``, PyTorch's fused SDPA with
  ``is_causal=True`` (its CPU flash kernel skips the key blocks above the diagonal),
  ``merge_heads``, output projection.
* ``torch_mha``: ``nn.MultiheadAttention(batch_first=True)`` in eval mode with its
  causal ``attn_mask`` (boolean, True = blocked) and ``need_weights=False``. Under
  inference mode with ``query is key is value`` it takes its *fast path*,
  ``torch._native_multi_head_attention`` (the script counts the calls to prove it). On
  CPU that path is the materialising one: ``bmm``, ``_masked_softmax``, ``bmm`` over the
  full ``(b, h, L, L)`` scores (400 MB here), computing the masked upper half too
  (checked with ``torch.profiler``).
* ``torch_mha_is_causal``: the same module with the fast path switched off
  (``torch.backends.mha.set_fastpath_enabled(False)``) and ``is_causal=True`` passed as
  a hint beside the mask: ``F.multi_head_attention_forward`` then drops the mask and
  calls SDPA with ``is_causal=True``, the best torch's module can do here. For context
  only.
* ``naive_heads``: a loop over the 12 heads, each with its own three
  ``nn.Linear(768, 64)`` projections and the package's materialising reference
  ``scaled_dot_product_attention``, then concatenation and the output projection.
* ``raw_sdpa``: the lower bound: one packed ``F.linear`` for q, k, v, views, fused SDPA
  with ``is_causal=True``, output ``F.linear``.

All contenders share the same weights and are checked to agree before timing (that
first call is also the warm-up). Prints ratios (time / package time) and saves
``src/attention/benchmark_results/mha.json``.

Keys: ``stamp``, ``setting``, ``load_average`` ([before, after]),
``torch_mha_fast_path``, ``torch_mha_path``, ``max_abs_diff_vs_package``, ``median_s``,
``ratio_to_package``, ``speedup_vs_torch_mha``, as before; added: ``median_s_q1`` and
``median_s_q3`` (interquartile range of each contender, beside ``median_s``),
``separated_from_package`` (per contender: its interquartile range and the package's do
not overlap), ``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/mha.py`` (about two minutes on a quiet machine).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
import torch.nn.functional as F
from _common import (
    THREADS,
    begin,
    finish,
    interleaved_stats,
    protocol_config,
    separated,
)
from torch import nn

from attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention

ORDER = 10  # place in run_all.py's session
BATCH, LENGTH, EMBED, HEADS = 8, 1024, 768, 12
ROLES = ("w_query", "w_key", "w_value")
WARMUP = 0  # the correctness check before timing is the warm-up


class NaiveHeads(nn.Module):
    """One module per head (its own three projections), looped: the textbook picture."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        d, h = mha.head_dim, mha.num_heads
        self.heads = nn.ModuleList()
        for n in range(h):
            rows = slice(n * d, (n + 1) * d)
            head = nn.ModuleDict({role: nn.Linear(EMBED, d) for role in ROLES})
            with torch.no_grad():
                for role, layer in head.items():
                    src = getattr(mha, role)
                    layer.weight.copy_(src.weight[rows])
                    layer.bias.copy_(src.bias[rows])
            self.heads.append(head)
        self.w_out = mha.w_out

    def forward(self, x):
        outs = [
            scaled_dot_product_attention(
                head["w_query"](x), head["w_key"](x), head["w_value"](x), is_causal=True
            )  # (b, L, d)
            for head in self.heads
        ]
        return self.w_out(torch.cat(outs, dim=-1))  # (b, L, h*d)


def raw_sdpa(x, w_in, b_in, w_out, b_out):
    """Packed projection, views, fused SDPA, output projection: nothing else."""
    b, n, e = x.shape
    qkv = F.linear(x, w_in, b_in).view(b, n, 3, HEADS, e // HEADS)  # (b, L, 3, h, d)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (b, h, L, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, L, d)
    return F.linear(out.transpose(1, 2).reshape(b, n, e), w_out, b_out)


def main() -> None:
    run = begin("mha")
    torch.set_num_threads(THREADS)
    batch, length = (1, 64) if run.quick else (BATCH, LENGTH)
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(EMBED, HEADS, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_bias.normal_(std=0.02)
        ref.out_proj.bias.normal_(std=0.02)
    ours = MultiHeadAttention.from_torch(ref).eval()
    naive = NaiveHeads(ours).eval()
    x = torch.randn(batch, length, EMBED)
    blocked = ~causal_mask(length)  # torch's polarity: True = blocked
    w_in, b_in = ref.in_proj_weight.detach(), ref.in_proj_bias.detach()
    w_out, b_out = ref.out_proj.weight.detach(), ref.out_proj.bias.detach()

    def torch_mha_is_causal():
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            out = ref(x, x, x, attn_mask=blocked, is_causal=True, need_weights=False)
            return out[0]
        finally:
            torch.backends.mha.set_fastpath_enabled(True)

    fns = {
        "package": lambda: ours(x, x, x, is_causal=True)[0],
        "torch_mha": lambda: ref(x, x, x, attn_mask=blocked, need_weights=False)[0],
        "torch_mha_is_causal": torch_mha_is_causal,
        "naive_heads": lambda: naive(x),
        "raw_sdpa": lambda: raw_sdpa(x, w_in, b_in, w_out, b_out),
    }

    # Count the fast-path calls of nn.MultiheadAttention during the check.
    native = torch._native_multi_head_attention
    calls = {"n": 0}

    def counting(*args, **kwargs):
        calls["n"] += 1
        return native(*args, **kwargs)

    torch._native_multi_head_attention = counting
    try:
        with torch.inference_mode():
            outs = {name: fn() for name, fn in fns.items()}
    finally:
        torch._native_multi_head_attention = native
    fast_path = calls["n"] == 1  # torch_mha only; the hinted variant has it off
    max_diff = {n: float((o - outs["package"]).abs().max()) for n, o in outs.items()}
    for name, diff in max_diff.items():
        assert diff < 1e-4, f"{name} differs from the package by {diff}"
    del outs
    stats = interleaved_stats(fns, warmup=WARMUP, repeat=run.repeat)
    times = {name: st["median"] for name, st in stats.items()}
    ratios = {name: t / times["package"] for name, t in times.items()}
    print(f"batch {batch}, length {length}; took the fast path: {fast_path}")
    for name, t in times.items():
        print(f"{name:<22}{1e3 * t:>12.1f} ms {ratios[name]:>8.2f} x package")
    setting = protocol_config(
        run,
        batch=batch,
        length=length,
        embed_dim=EMBED,
        num_heads=HEADS,
        causal=True,
        dtype="float32",
        mode="forward, inference_mode",
        warmup=WARMUP + 1,
    )
    path = "F.multi_head_attention_forward"
    if fast_path:
        path = (
            "torch._native_multi_head_attention on CPU: bmm, _masked_softmax, bmm "
            "over the full (b, h, L, L) scores"
        )
    finish(
        run,
        {
            "setting": setting,
            "load_average": None,  # filled by finish: [before, after]
            "torch_mha_fast_path": fast_path,
            "torch_mha_path": path,
            "max_abs_diff_vs_package": max_diff,
            "median_s": times,
            "median_s_q1": {name: st["q1"] for name, st in stats.items()},
            "median_s_q3": {name: st["q3"] for name, st in stats.items()},
            "separated_from_package": {
                name: separated(st, stats["package"]) for name, st in stats.items()
            },
            "ratio_to_package": ratios,
            "speedup_vs_torch_mha": ratios["torch_mha"],
        },
    )


if __name__ == "__main__":
    main()
