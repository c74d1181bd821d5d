"""Tests for attention/efficient/triton_flash.py: the FlashAttention-2 Triton kernels.

Without CUDA they run under Triton's interpreter (TRITON_INTERPRET=1, which the module
chooses when it is the first to import Triton on a machine without CUDA) on CPU tensors;
on a machine with CUDA (and the interpreter off) the same tests run the compiled kernels
on CUDA tensors: every test takes the ``device`` fixture. Sizes are small: the
interpreter executes every program of the grid in Python. The kernels multiply float32
in IEEE float32 (``input_precision="ieee"``), not TF32, so the float32 tolerances below
hold on a GPU too.

Tolerances (float32, unit-normal inputs): outputs, log-sum-exp and gradients agree with
torch's SDPA and with ``tiled_attention`` within 2e-5 + 1e-5·|expected| (both sides are
float32 computations that sum in different orders); gradients, which reach about 20
here, within 1e-4 + 1e-5·|expected|. In float16 the rule is flash-attn's: the error
against a float32 reference is at most twice that of torch's own float16 SDPA.
"""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="the optional dependency triton is not installed")

from attention import scaled_dot_product_attention, tiled_attention
from attention.efficient import triton_flash
from attention.efficient.tiled import flash_tile_kinds
from attention.efficient.triton_flash import (
    INTERPRETED,
    flash_attention_triton,
)

ATOL, RTOL = 2e-5, 1e-5
GRAD_ATOL = 1e-4
# The interpreter runs CPU tensors; compiled kernels run CUDA tensors (one per process).
DEVICES = ["cpu"] if INTERPRETED else ["cuda"]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# (b, h, i, j, d): lengths not multiples of the block (16 on the interpreter), i != j
# both ways, d in {16, 32, 64} and one d (40) that the kernel pads to a block of 64
SHAPES = [
    (1, 2, 37, 37, 16),
    (2, 1, 20, 45, 32),
    (1, 1, 45, 20, 32),
    (1, 1, 50, 50, 64),
    (1, 1, 1, 7, 16),
    (1, 1, 24, 33, 40),
]


def _qkv(b, h, i, j, d, seed=0, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(device)
    return make(i).requires_grad_(), make(j).requires_grad_(), make(j).requires_grad_()


def _grads(out, inputs, seed=1):
    gen = torch.Generator().manual_seed(seed)
    upstream = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
    return torch.autograd.grad(out, inputs, upstream)


@pytest.mark.slow  # Triton's interpreter: make test, not make check
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_output_and_gradients_equal_torch_sdpa(shape, is_causal, device):
    q, k, v = _qkv(*shape, device=device)
    out = flash_attention_triton(q, k, v, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for got, want in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(got, want, atol=GRAD_ATOL, rtol=RTOL)


@pytest.mark.slow  # Triton's interpreter: make test, not make check
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_output_lse_and_gradients_equal_tiled_attention(shape, is_causal, device):
    q, k, v = _qkv(*shape, seed=3, device=device)
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


def test_lse_is_the_log_sum_exp_of_the_scaled_scores(device):
    q, k, v = _qkv(1, 1, 20, 30, 16, seed=5, device=device)
    _, lse = flash_attention_triton(q, k, v, return_lse=True)
    scores = (q.detach().double() @ k.detach().double().transpose(-1, -2)) / 4.0
    torch.testing.assert_close(
        lse.double(), torch.logsumexp(scores, -1), atol=ATOL, rtol=RTOL
    )


def test_block_size_does_not_change_the_result(device):
    q, k, v = _qkv(1, 1, 70, 70, 32, seed=7, device=device)
    small = flash_attention_triton(q, k, v, is_causal=True, block_size=16)
    large = flash_attention_triton(q, k, v, is_causal=True, block_size=32)
    torch.testing.assert_close(small, large, atol=ATOL, rtol=RTOL)
    # a block longer than the sequence is cut to it (128 here): same result
    whole = flash_attention_triton(q, k, v, is_causal=True, block_size=256)
    torch.testing.assert_close(whole, small, atol=ATOL, rtol=RTOL)


HALF = [torch.float16] if INTERPRETED else [torch.float16, torch.bfloat16]


@pytest.mark.slow  # Triton's interpreter: make test, not make check
@pytest.mark.parametrize("half", HALF)
@pytest.mark.parametrize("is_causal", [False, True])
def test_half_precision_error_at_most_twice_torch_own(is_causal, half, device):
    """flash-attn's rule: against a float32 reference, the kernel's float16 (bfloat16 on
    CUDA) error, output and the three gradients, is at most twice what PyTorch's SDPA
    makes in the same precision."""
    q, k, v = (t.detach() for t in _qkv(1, 2, 40, 40, 32, seed=9, device=device))
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    upstream = upstream.to(device)

    def run(attend, dtype):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = attend(*inputs, is_causal=is_causal)
        grads = torch.autograd.grad(out, inputs, upstream.to(dtype))
        return [t.float() for t in (out, *grads)]

    reference = run(F.scaled_dot_product_attention, torch.float32)
    ours = run(flash_attention_triton, half)
    torchs = run(F.scaled_dot_product_attention, half)
    for name, r, a, t in zip(("out", "dq", "dk", "dv"), reference, ours, torchs):
        assert (a - r).abs().max() <= 2 * (t - r).abs().max() + 1e-6, name


def _record_forward_tiles(i, j, block, is_causal):
    """(program, key block, masked) for every key block the forward kernel folds in.

    Under the interpreter the kernel is Python that looks ``flash_forward_block`` up in
    the module when it calls it, so a plain Python wrapper sees every call.
    """
    import triton.language as tl

    as_int = lambda x: int(x.handle.data.item()) if hasattr(x, "handle") else int(x)
    visits, original = [], triton_flash.flash_forward_block

    def recording(*args):
        start_n, mask_causal = args[9], args[14]
        visits.append(
            (as_int(tl.program_id(0)), as_int(start_n) // block, bool(mask_causal))
        )
        return original(*args)

    triton_flash.flash_forward_block = recording
    try:
        q = torch.randn(1, 1, i, 16)
        k = torch.randn(1, 1, j, 16)
        flash_attention_triton(q, k, k, is_causal=is_causal, block_size=block)
    finally:
        triton_flash.flash_forward_block = original
    return visits


@pytest.mark.slow  # Triton's interpreter: make test, not make check
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


def _launches(q, k, v, block):
    """``(kernel name, grid, PRECISION)`` of every launch of one forward and backward.

    Every launch goes through ``kernel_for(kernel, device)[grid](...)``: a wrapper in
    its place sees the grid and the launch's keyword arguments.
    """
    launches, original = [], triton_flash.kernel_for

    def counting(kernel, device):
        launch = original(kernel, device)

        class Recorder:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    precision = kwargs.get("PRECISION")
                    launches.append((kernel.fn.__name__, tuple(grid), precision))
                    return launch[grid](*args, **kwargs)

                return run

        return Recorder()

    triton_flash.kernel_for = counting
    try:
        flash_attention_triton(q, k, v, block_size=block).sum().backward()
    finally:
        triton_flash.kernel_for = original
    return launches


@pytest.mark.slow  # Triton's interpreter: make test, not make check
def test_launched_programs_match_the_grid_formulas(device):
    """Wrap the launch: the forward and the dQ and D kernels run one program per query
    block and batch·head, the dK/dV kernel one per key block and batch·head."""
    b, h, i, j, block = 2, 3, 40, 20, 16
    launches = _launches(*_qkv(b, h, i, j, 16, seed=13, device=device), block)
    query_blocks, key_blocks = -(-i // block), -(-j // block)
    assert [(name, grid) for name, grid, _ in launches] == [
        ("flash_forward_kernel", (query_blocks, b * h)),
        ("flash_backward_delta_kernel", (query_blocks, b * h)),
        ("flash_backward_dkdv_kernel", (key_blocks, b * h)),
        ("flash_backward_dq_kernel", (query_blocks, b * h)),
    ]


@pytest.mark.parametrize(
    "dtype, precision", [(torch.float32, "ieee"), (torch.float16, "tf32")]
)
def test_float32_products_are_ieee_not_tf32(dtype, precision, device):
    """On NVIDIA GPUs tl.dot multiplies float32 in TF32 unless told otherwise (errors
    near 1e-3); every kernel that multiplies is launched with input_precision "ieee"
    for float32 (half precision products are exact either way: the default stays)."""
    launches = _launches(*_qkv(1, 1, 20, 20, 16, dtype=dtype, device=device), 16)
    dots = {name: p for name, _, p in launches if name != "flash_backward_delta_kernel"}
    assert dots == dict.fromkeys(
        [
            "flash_forward_kernel",
            "flash_backward_dkdv_kernel",
            "flash_backward_dq_kernel",
        ],
        precision,
    )


def test_the_kernels_are_public_and_documented():
    for name in triton_flash.__all__:
        obj = getattr(triton_flash, name)
        doc = getattr(getattr(obj, "fn", obj), "__doc__", None) or (
            name == "INTERPRETED"
        )
        assert doc, name
    assert "flash_forward_block" in triton_flash.__all__


def test_no_weight_matrix_is_saved_for_backward(device):
    q, k, v = _qkv(1, 1, 40, 48, 16, seed=11, device=device)
    out = flash_attention_triton(q, k, v)
    saved = out.grad_fn.saved_tensors
    assert all(40 * 48 not in (t.numel(),) for t in saved)
    assert max(t.numel() for t in saved) == 48 * 16


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(attn_mask=torch.ones(8, 8, dtype=torch.bool)),
            ValueError,
            "takes no attn_mask: its kernels apply only the causal mask",
        ),
        (
            dict(
                query=torch.randn(1, 1, 8, 16).double(),
                key=torch.randn(1, 1, 8, 16).double(),
                value=torch.randn(1, 1, 8, 16).double(),
            ),
            TypeError,
            "float16, bfloat16 or float32",
        ),
        (dict(value=torch.randn(1, 1, 8, 32)), ValueError, "one size d"),
        (dict(key=torch.randn(1, 1, 9, 16)), ValueError, "same number of positions j"),
        (
            dict(
                query=torch.randn(2, 1, 8, 16),
                key=torch.randn(3, 1, 8, 16),
                value=torch.randn(3, 1, 8, 16),
            ),
            ValueError,
            "must broadcast",
        ),
        (dict(is_causal="yes"), TypeError, "is_causal must be a bool"),
        (dict(enable_gqa=1), TypeError, "enable_gqa must be a bool"),
        (
            dict(
                query=torch.randn(1, 3, 8, 16),
                enable_gqa=True,
                key=torch.randn(1, 2, 8, 16),
                value=torch.randn(1, 2, 8, 16),
            ),
            ValueError,
            "multiple of the key/value heads",
        ),
        (dict(scale=True), TypeError, "scale must be a float"),
        (dict(block_size=24), ValueError, "power of two"),
        (dict(block_size=8), ValueError, "block_size must be >= 16, got 8"),
        (dict(block_size=2**20), ValueError, "from 16 .* to 256 .* got 1048576"),
        (dict(block_size=16.0), TypeError, "block_size must be an int"),
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


@pytest.mark.slow  # Triton's interpreter: make test, not make check
@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_query_heads_and_broadcast_batch_as_torch(is_causal, device):
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(2, 4, 20, 16, generator=gen).to(device).requires_grad_()
    k = torch.randn(1, 2, 20, 16, generator=gen).to(device).requires_grad_()
    v = torch.randn(1, 2, 20, 16, generator=gen).to(device).requires_grad_()
    out = flash_attention_triton(q, k, v, is_causal=is_causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(
        q,
        k.expand(2, -1, -1, -1),
        v.expand(2, -1, -1, -1),
        is_causal=is_causal,
        enable_gqa=True,
    )
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for got, want in zip(_grads(out, (q, k, v)), _grads(ref, (q, k, v))):
        torch.testing.assert_close(got, want, atol=GRAD_ATOL, rtol=RTOL)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy meets NaN
@pytest.mark.parametrize("scale", [-0.5, 0.0, float("nan")])
def test_any_real_scale_behaves_as_in_torch(scale, device):
    """The contract allows every real scale: a negative one flips the scores, zero gives
    the mean of the values, NaN makes every output NaN (as torch's SDPA)."""
    q, k, v = _qkv(1, 2, 20, 25, 16, seed=23, device=device)
    out = flash_attention_triton(q, k, v, scale=scale)
    ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy meets NaN
def test_an_inf_score_against_a_skipped_key_makes_its_row_nan(device):
    """The package's rule: a NaN or +inf score poisons its row even against a key the
    causal kernel never loads (a block above the diagonal), as the dense reference."""
    q, k, v = (
        t.detach().clone() for t in _qkv(1, 1, 40, 40, 16, seed=25, device=device)
    )
    q[..., 0] = 1.0
    k[..., 39, 0] = float("inf")  # in the last block: every other block's future
    out = flash_attention_triton(q, k, v, is_causal=True)
    ref = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert ref.isnan().all()
    torch.testing.assert_close(out, ref, equal_nan=True)


@pytest.mark.parametrize("i, j, d", [(3, 0, 16), (0, 5, 16), (4, 5, 0)])
def test_nothing_to_compute_as_torch(i, j, d, device):
    gen = torch.Generator().manual_seed(27)
    q = torch.randn(1, 2, i, d, generator=gen).to(device).requires_grad_()
    k = torch.randn(1, 2, j, d, generator=gen).to(device)
    v = torch.randn(1, 2, j, 16 if d == 0 else d, generator=gen).to(device)
    out, lse = flash_attention_triton(q, k, v, return_lse=True)
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, ref)
    scores = (q @ k.transpose(-2, -1)).detach() / max(d, 1) ** 0.5
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    if i:
        (grad,) = torch.autograd.grad(out.sum(), (q,))
        assert (grad == 0).all()


@pytest.mark.skipif(
    not INTERPRETED, reason="bfloat16 is refused only by the interpreter"
)
def test_interpreter_refuses_bfloat16():
    q = torch.randn(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="no bfloat16"):
        flash_attention_triton(q, q, q)


@pytest.mark.skipif(
    not INTERPRETED, reason="compiled kernels inline their inner step: no call to see"
)
@pytest.mark.parametrize(
    "i, j, is_causal",
    [(64, 64, True), (64, 64, False), (45, 70, True), (70, 45, True), (20, 33, False)],
)
def test_the_forward_kernel_visits_the_tiles_flash_tile_kinds_names(i, j, is_causal):
    """Under the interpreter the kernel looks its inner step up in the module at every
    call: a wrapper there sees which program folds in which key block, masked or not."""
    block, calls, original = 16, [], triton_flash.flash_forward_block
    as_int = lambda x: int(x.handle.data.item()) if hasattr(x, "handle") else int(x)

    def recording(*args):
        start_n, mask_causal = args[9], args[14]
        program = as_int(triton_flash.tl.program_id(0))
        calls.append((program, as_int(start_n) // block, bool(mask_causal)))
        return original(*args)

    triton_flash.flash_forward_block = recording
    try:
        q, k = torch.randn(1, 1, i, 16), torch.randn(1, 1, j, 16)
        flash_attention_triton(q, k, k, is_causal=is_causal, block_size=block)
    finally:
        triton_flash.flash_forward_block = original
    seen = torch.zeros(-(-i // block), -(-j // block), dtype=torch.long)
    for program, key_block, masked in calls:
        assert seen[program, key_block] == 0, "a tile visited twice"
        seen[program, key_block] = 2 if masked else 1
    assert torch.equal(seen, flash_tile_kinds(i, j, block, is_causal=is_causal))
