"""Tests for attention/efficient/triton_flash.py: the FlashAttention-2 Triton kernels.

Without CUDA they run under Triton's interpreter (TRITON_INTERPRET=1, which the module
chooses when it is the first to import Triton on a machine without CUDA). Sizes are small:
the interpreter executes every program of the grid in Python.

Tolerances (float32, unit-normal inputs): outputs, log-sum-exp and gradients agree with
torch's SDPA and with ``tiled_attention`` within 2e-5 + 1e-5·|expected| (both sides are
float32 computations that sum in different orders); gradients, which reach about 20 here,
within 1e-4 + 1e-5·|expected|. In float16 the rule is flash-attn's:
the error against a float32 reference is at most twice that of torch's own float16 SDPA.
"""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the optional dependency triton is not installed")

from attention import tiled_attention  # noqa: E402
from attention.efficient.triton_flash import INTERPRETED, flash_attention_triton  # noqa: E402

ATOL, RTOL = 2e-5, 1e-5
GRAD_ATOL = 1e-4
DEVICE = "cpu" if INTERPRETED else "cuda"

# (b, h, i, j, d): lengths not multiples of the block (16 on the interpreter), i != j both
# ways, d in {16, 32, 64} and one d (40) that the kernel pads to a block of 64
SHAPES = [
    (1, 2, 37, 37, 16),
    (2, 1, 20, 45, 32),
    (1, 1, 45, 20, 32),
    (1, 1, 50, 50, 64),
    (1, 1, 1, 7, 16),
    (1, 1, 24, 33, 40),
]


def _qkv(b, h, i, j, d, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(DEVICE)
    return make(i).requires_grad_(), make(j).requires_grad_(), make(j).requires_grad_()


def _grads(out, inputs, seed=1):
    gen = torch.Generator().manual_seed(seed)
    upstream = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
    return torch.autograd.grad(out, inputs, upstream)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_output_and_gradients_equal_torch_sdpa(shape, is_causal):
    q, k, v = _qkv(*shape)
    out = flash_attention_triton(q, k, v, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for got, want in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(got, want, atol=GRAD_ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_output_lse_and_gradients_equal_tiled_attention(shape, is_causal):
    q, k, v = _qkv(*shape, seed=3)
    out, lse = flash_attention_triton(
        q, k, v, is_causal=is_causal, scale=0.3, return_lse=True
    )
    ref, ref_lse = tiled_attention(
        q, k, v, is_causal=is_causal, scale=0.3, return_lse=True
    )
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(lse, ref_lse, atol=ATOL, rtol=RTOL)
    # a loss that reads the log-sum-exp too: its gradient flows through dlse
    loss = lambda o, m: (o * o).sum() + m.sum()
    got = torch.autograd.grad(loss(out, lse), (q, k, v))
    want = torch.autograd.grad(loss(ref, ref_lse), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=GRAD_ATOL, rtol=RTOL)


def test_lse_is_the_log_sum_exp_of_the_scaled_scores():
    q, k, v = _qkv(1, 1, 20, 30, 16, seed=5)
    _, lse = flash_attention_triton(q, k, v, return_lse=True)
    scores = (q.detach().double() @ k.detach().double().transpose(-1, -2)) / 4.0
    torch.testing.assert_close(
        lse.double(), torch.logsumexp(scores, -1), atol=ATOL, rtol=RTOL
    )


def test_block_size_does_not_change_the_result():
    q, k, v = _qkv(1, 1, 70, 70, 32, seed=7)
    small = flash_attention_triton(q, k, v, is_causal=True, block_size=16)
    large = flash_attention_triton(q, k, v, is_causal=True, block_size=32)
    torch.testing.assert_close(small, large, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("is_causal", [False, True])
def test_float16_error_at_most_twice_torch_own(is_causal):
    """flash-attn's rule: against a float32 reference, the kernel's float16 error (output
    and the three gradients) is at most twice what PyTorch's SDPA makes in float16."""
    q, k, v = (t.detach() for t in _qkv(1, 2, 40, 40, 32, seed=9))
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))

    def run(attend, dtype):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = attend(*inputs, is_causal=is_causal)
        grads = torch.autograd.grad(out, inputs, upstream.to(dtype))
        return [t.float() for t in (out, *grads)]

    reference = run(F.scaled_dot_product_attention, torch.float32)
    ours = run(flash_attention_triton, torch.float16)
    torchs = run(F.scaled_dot_product_attention, torch.float16)
    for name, r, a, t in zip(("out", "dq", "dk", "dv"), reference, ours, torchs):
        assert (a - r).abs().max() <= 2 * (t - r).abs().max() + 1e-6, name


def _record_forward_tiles(i, j, block, is_causal):
    """(program, key block, masked) for every key block the forward kernel folds in.

    Under the interpreter the kernel is Python that looks ``_forward_block`` up in the
    module when it calls it, so a plain Python wrapper sees every call.
    """
    import triton.language as tl

    from attention.efficient import triton_flash

    as_int = lambda x: int(x.handle.data.item()) if hasattr(x, "handle") else int(x)
    visits, original = [], triton_flash._forward_block

    def recording(*args):
        start_n, mask_causal = args[9], args[14]
        visits.append(
            (as_int(tl.program_id(0)), as_int(start_n) // block, bool(mask_causal))
        )
        return original(*args)

    triton_flash._forward_block = recording
    try:
        q = torch.randn(1, 1, i, 16)
        k = torch.randn(1, 1, j, 16)
        flash_attention_triton(q, k, k, is_causal=is_causal, block_size=block)
    finally:
        triton_flash._forward_block = original
    return visits


@pytest.mark.skipif(
    not INTERPRETED, reason="the recording wrapper needs the interpreter"
)
@pytest.mark.parametrize("i, j", [(64, 64), (50, 50), (40, 70), (70, 40)])
def test_causal_forward_visits_the_blocks_below_the_diagonal_unmasked(i, j):
    block = 16
    visits = _record_forward_tiles(i, j, block, is_causal=True)
    expected = []
    for m in range(-(-i // block)):
        # key blocks wholly at or before the query block's first row: no mask
        expected += [(m, n, False) for n in range(min(m, -(-j // block)))]
        if m * block < j:  # the diagonal block exists: the only masked one
            expected.append((m, m, True))
    assert visits == expected  # also: programs run one after another, in order
    full = _record_forward_tiles(i, j, block, is_causal=False)
    assert len(full) == -(-i // block) * -(-j // block) and not any(v[2] for v in full)


def test_launched_programs_match_the_grid_formulas():
    """Wrap the launch: the forward and the dQ and D kernels run one program per query
    block and batch·head, the dK/dV kernel one per key block and batch·head."""
    from attention.efficient import triton_flash

    launches, original = [], triton_flash._kernel

    def counting(kernel, device):
        launch = original(kernel, device)

        class Recorder:
            def __getitem__(self, grid):
                launches.append((kernel.fn.__name__, tuple(grid)))
                return launch[grid]

        return Recorder()

    b, h, i, j, block = 2, 3, 40, 20, 16
    triton_flash._kernel = counting
    try:
        q, k, v = _qkv(b, h, i, j, 16, seed=13)
        out = flash_attention_triton(q, k, v, block_size=block)
        out.sum().backward()
    finally:
        triton_flash._kernel = original
    query_blocks, key_blocks = -(-i // block), -(-j // block)
    assert launches == [
        ("_flash_forward", (query_blocks, b * h)),
        ("_flash_backward_delta", (query_blocks, b * h)),
        ("_flash_backward_dkdv", (key_blocks, b * h)),
        ("_flash_backward_dq", (query_blocks, b * h)),
    ]


def test_no_weight_matrix_is_saved_for_backward():
    q, k, v = _qkv(1, 1, 40, 48, 16, seed=11)
    out = flash_attention_triton(q, k, v)
    saved = out.grad_fn.saved_tensors
    assert all(40 * 48 not in (t.numel(),) for t in saved)
    assert max(t.numel() for t in saved) == 48 * 16


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(query=torch.randn(2, 8, 16)[0]), ValueError, "at least one batch"),
        (
            dict(query=torch.randn(1, 1, 8, 16).double()),
            TypeError,
            "float16, bfloat16 or float32",
        ),
        (dict(value=torch.randn(1, 1, 8, 32)), ValueError, "one size d"),
        (dict(key=torch.randn(1, 1, 9, 16)), ValueError, "same number of positions j"),
        (
            dict(key=torch.randn(2, 1, 8, 16), value=torch.randn(2, 1, 8, 16)),
            ValueError,
            "no broadcasting",
        ),
        (
            dict(key=torch.randn(1, 1, 0, 16), value=torch.randn(1, 1, 0, 16)),
            ValueError,
            "at least one position",
        ),
        (dict(is_causal="yes"), TypeError, "is_causal must be a bool"),
        (dict(scale=-1.0), ValueError, "finite and positive"),
        (dict(scale=True), TypeError, "scale must be a float"),
        (dict(block_size=24), ValueError, "power of two"),
        (dict(query=[[1.0]]), TypeError, "query must be a torch.Tensor"),
    ],
)
def test_bad_input_is_refused_at_the_boundary(kwargs, error, message):
    args = dict(
        query=torch.randn(1, 1, 8, 16),
        key=torch.randn(1, 1, 8, 16),
        value=torch.randn(1, 1, 8, 16),
    )
    args.update(kwargs)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    with pytest.raises(error, match=message):
        flash_attention_triton(q, k, v, **args)


@pytest.mark.skipif(
    not INTERPRETED, reason="bfloat16 is refused only by the interpreter"
)
def test_interpreter_refuses_bfloat16():
    q = torch.randn(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="no bfloat16"):
        flash_attention_triton(q, q, q)
