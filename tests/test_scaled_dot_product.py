"""Tests for attention/foundations/scaled_dot_product.py against torch's fused SDPA, in
float64."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attention import attention_weights, causal_mask, scaled_dot_product_attention

f64 = torch.float64


def rand(*shape, g):
    return torch.randn(*shape, dtype=f64, generator=g)


def random_case(seed):
    """A random shape/mask/scale/GQA configuration, reproducible from its seed."""
    g = torch.Generator().manual_seed(seed)
    r = lambda n: int(torch.randint(1, n + 1, (1,), generator=g))
    batch = [r(3) for _ in range(r(3) - 1)]  # 0-2 leading batch dims
    hk = r(3)
    groups = r(3)
    gqa = seed % 3 == 0
    hq = hk * groups if gqa else hk
    i, j, d, e = r(7), r(9), r(6), r(5)
    q, k, v = (
        rand(*batch, hq, i, d, g=g),
        rand(*batch, hk, j, d, g=g),
        rand(*batch, hk, j, e, g=g),
    )
    kind = seed % 4
    mask, causal = None, False
    if kind == 1:
        mask = torch.rand(i, j, generator=g) > 0.3
        mask[:, 0] = (
            True  # keep at least one key per row; fully masked rows are tested apart
        )
    elif kind == 2:
        mask = rand(*batch, 1, i, j, g=g)
    elif kind == 3:
        causal = True
    scale = None if seed % 2 else float(torch.rand(1, generator=g)) + 0.1
    return q, k, v, dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)


@pytest.mark.parametrize("seed", range(40))
def test_parity_with_torch_outputs_and_gradients(seed):
    q, k, v, kw = random_case(seed)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = scaled_dot_product_attention(*inputs, **kw)
    theirs_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = F.scaled_dot_product_attention(*theirs_inputs, **kw)
    torch.testing.assert_close(ours, theirs)
    grad_out = torch.randn_like(ours)
    ours.backward(grad_out)
    theirs.backward(grad_out)
    for a, b in zip(inputs, theirs_inputs):
        torch.testing.assert_close(a.grad, b.grad)


def test_weights_are_what_the_values_are_multiplied_by():
    q, k, v, kw = random_case(6)
    w = attention_weights(q, k, **kw)
    out = scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(
        w @ v.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3), out
    )


def test_default_scale_is_inverse_sqrt_d():
    g = torch.Generator().manual_seed(1)
    q, k, v = rand(3, 16, g=g), rand(5, 16, g=g), rand(5, 2, g=g)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v),
        scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(16)),
    )


def test_gqa_groups_like_repeat_interleave():
    g = torch.Generator().manual_seed(2)
    q, k, v = rand(2, 6, 3, 4, g=g), rand(2, 2, 5, 4, g=g), rand(2, 2, 5, 3, g=g)
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    # query heads 0-2 share key/value head 0, heads 3-5 share head 1
    for h in range(6):
        torch.testing.assert_close(
            out[:, h], scaled_dot_product_attention(q[:, h], k[:, h // 3], v[:, h // 3])
        )


def test_dropout_uses_torch_rng_like_torch():
    g = torch.Generator().manual_seed(3)
    q, k, v = rand(2, 4, 5, g=g), rand(2, 6, 5, g=g), rand(2, 6, 3, g=g)
    torch.manual_seed(0)
    ours = scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.manual_seed(0)
    theirs = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    torch.testing.assert_close(ours, theirs)
    assert not torch.allclose(ours, scaled_dot_product_attention(q, k, v))


def test_fully_masked_row_gives_zero_output_and_finite_gradients():
    g = torch.Generator().manual_seed(4)
    q, k, v = (rand(1, 3, 4, 5, g=g).requires_grad_() for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[..., 2, :], torch.zeros_like(q.grad[..., 2, :]))
    w = attention_weights(q, k, attn_mask=mask)
    assert torch.equal(w[..., 2, :], torch.zeros_like(w[..., 2, :]))
    # the same through a float mask of -inf
    add = torch.zeros(4, 4, dtype=f64).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, attn_mask=add), out
    )


def test_gradcheck():
    g = torch.Generator().manual_seed(5)
    q, k, v = (rand(2, 3, 4, g=g).requires_grad_() for _ in range(3))
    mask = causal_mask(3, 3)
    assert torch.autograd.gradcheck(
        lambda a, b, c: scaled_dot_product_attention(a, b, c, attn_mask=mask), (q, k, v)
    )
    assert torch.autograd.gradcheck(
        lambda a, b: attention_weights(a, b, is_causal=True, scale=0.7), (q, k)
    )


shapes = st.tuples(
    st.integers(1, 6), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1)
)


@given(shapes)
def test_rows_sum_to_one_and_masked_weights_are_exactly_zero(params):
    i, j, d, seed = params
    g = torch.Generator().manual_seed(seed)
    q, k = rand(2, i, d, g=g) * 5, rand(2, j, d, g=g) * 5
    mask = torch.rand(2, i, j, generator=g) > 0.4
    w = attention_weights(q, k, attn_mask=mask)
    assert torch.equal(w[~mask], torch.zeros_like(w[~mask]))
    alive = mask.any(-1)
    torch.testing.assert_close(w.sum(-1)[alive], torch.ones_like(w.sum(-1)[alive]))
    assert torch.equal(w.sum(-1)[~alive], torch.zeros_like(w.sum(-1)[~alive]))


@given(shapes)
def test_self_attention_is_permutation_equivariant(params):
    n, _, d, seed = params
    g = torch.Generator().manual_seed(seed)
    x = rand(n, d, g=g)
    perm = torch.randperm(n, generator=g)
    out = scaled_dot_product_attention(x, x, x)
    torch.testing.assert_close(
        scaled_dot_product_attention(x[perm], x[perm], x[perm]), out[perm]
    )


@given(shapes, st.floats(-50, 50))
def test_adding_a_constant_to_every_score_of_a_row_changes_nothing(params, c):
    i, j, d, seed = params
    g = torch.Generator().manual_seed(seed)
    q, k, v = rand(i, d, g=g), rand(j, d, g=g), rand(j, 2, g=g)
    shift = torch.full((i, j), c, dtype=f64)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, attn_mask=shift),
        scaled_dot_product_attention(q, k, v),
    )


T = lambda *s, dtype=f64: torch.zeros(*s, dtype=dtype)
BAD = {
    "query not a tensor": (
        lambda: scaled_dot_product_attention([[1.0]], T(2, 2), T(2, 2)),
        TypeError,
        "query must be a torch.Tensor, got list",
    ),
    "integer query": (
        lambda: scaled_dot_product_attention(
            T(2, 2, dtype=torch.long), T(2, 2), T(2, 2)
        ),
        TypeError,
        "query must have a floating-point dtype, got torch.int64",
    ),
    "mixed dtypes": (
        lambda: scaled_dot_product_attention(
            T(2, 2), T(2, 2, dtype=torch.float32), T(2, 2)
        ),
        TypeError,
        "query and key must share a dtype",
    ),
    "query 1-D": (
        lambda: scaled_dot_product_attention(T(4), T(2, 4), T(2, 4)),
        ValueError,
        r"query must have at least 2 dimensions, got shape \(4,\)",
    ),
    "d mismatch": (
        lambda: scaled_dot_product_attention(T(3, 24), T(5, 16), T(5, 2)),
        ValueError,
        "query and key must share their last dimension d, got 24 and 16",
    ),
    "j mismatch": (
        lambda: scaled_dot_product_attention(T(3, 4), T(5, 4), T(6, 2)),
        ValueError,
        "key and value must have the same number of positions j, got 5 and 6",
    ),
    "batch": (
        lambda: scaled_dot_product_attention(T(2, 3, 4), T(3, 5, 4), T(3, 5, 2)),
        ValueError,
        r"batch dims of query, key and value must broadcast .* "
        r"got \(2,\) and \(3,\) and \(3,\)",
    ),
    "mask shape": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(5, 4), T(5, 2), attn_mask=torch.ones(3, 4, dtype=torch.bool)
        ),
        ValueError,
        r"attn_mask of shape \(3, 4\) does not broadcast to .* \(3, 5\)",
    ),
    "mask dtype": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(5, 4), T(5, 2), attn_mask=torch.ones(3, 5, dtype=torch.long)
        ),
        TypeError,
        "attn_mask must be boolean .* or floating .* got torch.int64",
    ),
    "float mask dtype": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(5, 4), T(5, 2), attn_mask=T(3, 5, dtype=torch.float16)
        ),
        TypeError,
        r"float attn_mask must have the query's dtype torch.float64 \(or float32\)",
    ),
    "mask and causal": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(3, 4), T(3, 2), attn_mask=causal_mask(3), is_causal=True
        ),
        ValueError,
        "either attn_mask or is_causal=True, not both",
    ),
    "dropout negative": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4), T(3, 2), dropout_p=-0.1),
        ValueError,
        r"dropout_p must lie in \[0, 1\], got -0.1",
    ),
    "heads without gqa": (
        lambda: scaled_dot_product_attention(
            T(1, 8, 3, 4), T(1, 2, 3, 4), T(1, 2, 3, 2)
        ),
        ValueError,
        "query has 8 heads but key has 2; .* enable_gqa=True",
    ),
    "heads not dividing": (
        lambda: scaled_dot_product_attention(
            T(1, 6, 3, 4), T(1, 4, 3, 4), T(1, 4, 3, 2), enable_gqa=True
        ),
        ValueError,
        "multiple of the key/value heads, got 6 query heads and 4",
    ),
    "gqa kv heads differ": (
        lambda: scaled_dot_product_attention(
            T(1, 4, 3, 4), T(1, 2, 3, 4), T(1, 1, 3, 2), enable_gqa=True
        ),
        ValueError,
        "key and value must have the same number of heads, got 2 and 1",
    ),
    "gqa without heads axis": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(3, 4), T(3, 2), enable_gqa=True
        ),
        ValueError,
        "enable_gqa=True needs a heads axis",
    ),
    "is_causal not bool": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4), T(3, 2), is_causal=1),
        TypeError,
        "is_causal must be a bool",
    ),
    "scale not number": (
        lambda: attention_weights(T(3, 4), T(3, 4), scale="1"),
        TypeError,
        "scale must be a float or None, got str",
    ),
    "scale bool": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4), T(3, 2), scale=True),
        TypeError,
        "scale must be a float or None, got bool",
    ),
    "enable_gqa not bool": (
        lambda: scaled_dot_product_attention(
            T(1, 2, 3, 4), T(1, 2, 3, 4), T(1, 2, 3, 2), enable_gqa="no"
        ),
        TypeError,
        "enable_gqa must be a bool .* got str 'no'",
    ),
    "value None": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4), None),
        TypeError,
        "value must be a torch.Tensor, got NoneType",
    ),
    "dropout bool": (
        lambda: scaled_dot_product_attention(
            T(3, 4), T(3, 4), T(3, 2), dropout_p=False
        ),
        TypeError,
        "dropout_p must be a float, got bool",
    ),
    "meta device": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4).to("meta"), T(3, 2)),
        ValueError,
        "query and key must be on the same device, got cpu and meta",
    ),
    "value device": (
        lambda: scaled_dot_product_attention(T(3, 4), T(3, 4), T(3, 2).to("meta")),
        ValueError,
        "query and value must be on the same device, got cpu and meta",
    ),
    "mask device": (
        lambda: attention_weights(
            T(3, 4), T(3, 4), attn_mask=causal_mask(3, device="meta")
        ),
        ValueError,
        "query and attn_mask must be on the same device, got cpu and meta",
    ),
    "attention_weights positional mask": (
        lambda: attention_weights(T(3, 4), T(3, 4), causal_mask(3)),
        TypeError,
        "positional argument",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input(name):
    call, exc, match = BAD[name]
    with pytest.raises(exc, match=match):
        call()


def test_leading_batch_dims_broadcast_like_matmul():
    g = torch.Generator().manual_seed(7)
    q, k, v = rand(2, 1, 3, 4, g=g), rand(1, 3, 5, 4, g=g), rand(1, 3, 5, 2, g=g)
    out = scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 3, 2)
    for b, h in itertools.product(range(2), range(3)):
        torch.testing.assert_close(
            out[b, h], scaled_dot_product_attention(q[b, 0], k[0, h], v[0, h])
        )


# ---------------------------------------------------------------- edge cases, as torch


def _same_as_torch(*args, **kw):
    """Outputs equal to torch's SDPA, NaN where torch has NaN."""
    ours = scaled_dot_product_attention(*args, **kw)
    theirs = F.scaled_dot_product_attention(*args, **kw)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, equal_nan=True)


@pytest.mark.parametrize(
    "i, j, d, e", [(3, 0, 4, 2), (0, 3, 4, 2), (3, 4, 0, 2), (3, 4, 2, 0), (0, 0, 0, 0)]
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_axes_behave_as_torch(i, j, d, e, is_causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = rand(2, i, d, g=g), rand(2, j, d, g=g), rand(2, j, e, g=g)
    _same_as_torch(q, k, v, is_causal=is_causal)
    w = attention_weights(q, k, is_causal=is_causal)
    assert w.shape == (2, i, j) and not w.isnan().any()
    if j == 0:  # no key at all: zero output, as torch
        assert torch.equal(
            scaled_dot_product_attention(q, k, v), torch.zeros(2, i, e, dtype=f64)
        )


def test_nan_propagates_as_in_torch():
    g = torch.Generator().manual_seed(1)
    q, k, v = rand(1, 2, 3, 4, g=g), rand(1, 2, 5, 4, g=g), rand(1, 2, 5, 3, g=g)
    k_nan = k.clone()
    k_nan[0, 0, 2, 1] = float("nan")
    v_nan = v.clone()
    v_nan[0, 1, 4, 0] = float("nan")
    mask = torch.rand(3, 5, generator=g) > 0.5
    mask[:, 2] = False  # the NaN key is masked for every row: torch still gives NaN
    for kw in (
        {},
        {"is_causal": True},
        {"attn_mask": mask},
        {"scale": float("nan")},
        {"scale": float("inf")},
        {"attn_mask": torch.zeros(3, 5, dtype=torch.bool)},
    ):
        _same_as_torch(q, k_nan, v, **kw)
        _same_as_torch(q, k, v_nan, **kw)
        _same_as_torch(q, k, v, **kw)
    assert scaled_dot_product_attention(q, k_nan, v)[0, 0].isnan().all()
    assert scaled_dot_product_attention(q, k_nan, v, attn_mask=mask)[0, 0].isnan().all()


def test_overflowing_scores_behave_as_torch():
    q = torch.tensor([[1e200, 1.0], [1.0, 1.0]], dtype=f64)
    k = torch.tensor([[1e200, 0.0], [-1e200, 0.0]], dtype=f64)
    v = torch.tensor([[1.0], [2.0]], dtype=f64)
    _same_as_torch(q, k, v)
    assert scaled_dot_product_attention(q, k, v)[0].isnan().all()


def test_fully_masked_rows_give_zeros_with_float_masks_too():
    g = torch.Generator().manual_seed(2)
    q, k, v = rand(3, 4, g=g), rand(5, 4, g=g), rand(5, 2, g=g)
    float_mask = torch.zeros(3, 5, dtype=f64)
    float_mask[1] = float("-inf")
    _same_as_torch(q, k, v, attn_mask=float_mask)
    assert torch.equal(
        scaled_dot_product_attention(q, k, v, attn_mask=float_mask)[1],
        torch.zeros(2, dtype=f64),
    )


def test_gqa_equals_torch_enable_gqa_and_repeat_interleave():
    g = torch.Generator().manual_seed(3)
    q, k, v = rand(2, 6, 3, 4, g=g), rand(2, 2, 5, 4, g=g), rand(2, 2, 5, 3, g=g)
    ours = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    _same_as_torch(q, k, v, enable_gqa=True)
    repeated = scaled_dot_product_attention(
        q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    )
    torch.testing.assert_close(ours, repeated)


def test_dropout_draws_from_the_global_generator_only_after_validation():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with pytest.raises(ValueError):
        scaled_dot_product_attention(T(3, 4), T(5, 4), T(4, 2), dropout_p=0.5)
    assert torch.equal(torch.get_rng_state(), state)


def test_float32_mask_on_float64_inputs_and_dropout_one_as_torch():
    g = torch.Generator().manual_seed(4)
    q, k, v = rand(3, 4, g=g), rand(5, 4, g=g), rand(5, 2, g=g)
    mask = torch.randn(
        3, 5, generator=g
    )  # float32, as torch accepts for any query dtype
    _same_as_torch(q, k, v, attn_mask=mask)
    assert torch.equal(
        scaled_dot_product_attention(q, k, v, dropout_p=1.0),
        torch.zeros(3, 2, dtype=f64),
    )
