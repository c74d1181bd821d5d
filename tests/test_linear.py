"""Tests for attention/efficient/linear.py and attention/efficient/feature_maps.py: the
chunked and recurrent forms equal the naive quadratic form, and the contract's boundary
checks."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention import (
    lightning_attention,
    linear_attention,
    linear_attention_step,
    linear_attention_weights,
    random_feature_map,
    scaled_dot_product_attention,
)
from attention.efficient.feature_maps import elu_feature_map, relu_feature_map
from attention.efficient.linear import linear_attention_naive
from conftest import qkv

F64 = torch.float64


def grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


# ------------------------------------------------------------------------- feature maps


def test_elu_feature_map_is_elu_plus_one_and_positive():
    x = torch.linspace(-30, 5, 101, dtype=F64)
    torch.testing.assert_close(elu_feature_map(x), torch.nn.functional.elu(x) + 1)
    assert (elu_feature_map(x) > 0).all()


def test_elu_feature_map_gradient():
    x = torch.randn(7, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(elu_feature_map, (x,))


def test_relu_feature_map():
    x = torch.tensor([-1.0, 0.0, 2.5], dtype=F64)
    torch.testing.assert_close(
        relu_feature_map(x), torch.tensor([0.0, 0.0, 2.5], dtype=F64)
    )


def test_random_features_are_reproducible_and_positive():
    a = random_feature_map(8, 16, generator=torch.Generator().manual_seed(3))
    b = random_feature_map(8, 16, generator=torch.Generator().manual_seed(3))
    x = torch.randn(5, 8, dtype=F64)
    torch.testing.assert_close(a(x), b(x))
    assert a(x).shape == (5, 16)
    assert (a(x) > 0).all()


@pytest.mark.parametrize("orthogonal", [True, False])
def test_random_features_approximate_the_softmax_kernel(orthogonal):
    # E[phi(q) . phi(k)] = exp(q . k / sqrt(d)); with many features the average is
    # close.
    d = 4
    phi = random_feature_map(
        d, 20000, generator=torch.Generator().manual_seed(0), orthogonal=orthogonal
    )
    g = torch.Generator().manual_seed(1)
    q = 0.5 * torch.randn(6, d, generator=g, dtype=F64)
    k = 0.5 * torch.randn(6, d, generator=g, dtype=F64)
    exact = torch.exp(q @ k.T / math.sqrt(d))
    torch.testing.assert_close(phi(q) @ phi(k).T, exact, rtol=0.1, atol=0.0)


def test_random_features_approximate_softmax_attention():
    q, k, v = qkv(20, d=4, batch=(), seed=2)
    q, k = 0.5 * q, 0.5 * k
    phi = random_feature_map(4, 20000, generator=torch.Generator().manual_seed(0))
    approx = linear_attention(q, k, v, feature_map=phi, eps=0.0)
    exact = scaled_dot_product_attention(q, k, v)
    assert (approx - exact).abs().max() < 0.05


def test_random_feature_map_rejects_wrong_input_size():
    phi = random_feature_map(4, 8)
    with pytest.raises(ValueError, match="drawn for inputs of size d = 4, got 3"):
        phi(torch.zeros(2, 3))


# --------------------------------------------------------------------------- naive form


def test_naive_equals_explicit_kernel_formula():
    q, k, v = qkv(6, batch=())
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    eps = 1e-6
    expected = torch.stack(
        [
            sum(phi_q[t] @ phi_k[s] * v[s] for s in range(6))
            / (sum(phi_q[t] @ phi_k[s] for s in range(6)) + eps)
            for t in range(6)
        ]
    )
    torch.testing.assert_close(linear_attention_naive(q, k, v, eps=eps), expected)
    causal = torch.stack(
        [
            sum(phi_q[t] @ phi_k[s] * v[s] for s in range(t + 1))
            / (sum(phi_q[t] @ phi_k[s] for s in range(t + 1)) + eps)
            for t in range(6)
        ]
    )
    torch.testing.assert_close(
        linear_attention_naive(q, k, v, is_causal=True, eps=eps), causal
    )


def test_weights_rows_sum_to_one_and_causal_zeros():
    q, k, _ = qkv(9, 9)
    w = linear_attention_weights(q, k, is_causal=True, eps=0.0)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=F64))
    assert (w.triu(1) == 0).all()
    assert (w >= 0).all()


def test_eps_sits_in_the_denominator():
    q, k, v = qkv(4, batch=())
    w0 = linear_attention_weights(q, k, eps=0.0)
    w1 = linear_attention_weights(q, k, eps=0.5)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    den = (phi_q @ phi_k.T).sum(-1, keepdim=True)
    torch.testing.assert_close(w1, w0 * den / (den + 0.5))


# ------------------------------------------------------------------------ fast == naive

LENGTHS = [1, 2, 37, 64, 130]
CHUNKS = [1, 7, 16, 64]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_linear_equals_naive_outputs_and_gradients(n, chunk_size, is_causal):
    q, k, v = qkv(n, grad=True)
    fast = linear_attention(q, k, v, is_causal=is_causal, chunk_size=chunk_size)
    ref = linear_attention_naive(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(fast, ref)
    for a, b in zip(grads(fast, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("feature_map", [relu_feature_map, lambda x: x * x])
@pytest.mark.parametrize("is_causal", [False, True])
def test_other_feature_maps(feature_map, is_causal):
    q, k, v = qkv(23)
    fast = linear_attention(
        q, k, v, is_causal=is_causal, feature_map=feature_map, chunk_size=5
    )
    ref = linear_attention_naive(q, k, v, is_causal=is_causal, feature_map=feature_map)
    torch.testing.assert_close(fast, ref)


def test_feature_map_may_change_the_feature_size():
    phi = random_feature_map(8, 24, generator=torch.Generator().manual_seed(0))
    q, k, v = qkv(19)
    for causal in (False, True):
        torch.testing.assert_close(
            linear_attention(q, k, v, is_causal=causal, feature_map=phi, chunk_size=4),
            linear_attention_naive(q, k, v, is_causal=causal, feature_map=phi),
        )


@pytest.mark.parametrize("i, j", [(5, 3), (3, 9), (10, 1), (7, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_queries_and_keys_of_different_lengths(i, j, is_causal):
    q, k, v = qkv(i, j)
    torch.testing.assert_close(
        linear_attention(q, k, v, is_causal=is_causal, chunk_size=2),
        linear_attention_naive(q, k, v, is_causal=is_causal),
    )


def test_broadcast_batch_dims():
    q, _, _ = qkv(11, batch=(2, 3))
    _, k, v = qkv(11, batch=(1, 3), seed=4)
    for causal in (False, True):
        out = linear_attention(q, k, v, is_causal=causal, chunk_size=4)
        assert out.shape == (2, 3, 11, 5)
        torch.testing.assert_close(
            out, linear_attention_naive(q, k, v, is_causal=causal)
        )


def test_unbatched_input():
    q, k, v = qkv(13, batch=())
    torch.testing.assert_close(
        linear_attention(q, k, v, is_causal=True, chunk_size=4),
        linear_attention_naive(q, k, v, is_causal=True),
    )


def test_float32_close_to_float64():
    q, k, v = qkv(300)
    out = linear_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(
        out, linear_attention_naive(q, k, v, is_causal=True).float()
    )


@given(
    n=st.integers(1, 40),
    chunk_size=st.integers(1, 20),
    is_causal=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_property_chunked_equals_naive(n, chunk_size, is_causal, seed):
    q, k, v = qkv(n, d=3, e=2, batch=(2,), seed=seed)
    torch.testing.assert_close(
        linear_attention(q, k, v, is_causal=is_causal, chunk_size=chunk_size),
        linear_attention_naive(q, k, v, is_causal=is_causal),
    )


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_causal_future_poisoned_with_huge_values_changes_nothing_before(chunk_size):
    n, cut = 50, 29
    q, k, v = qkv(n)
    ref = linear_attention(q, k, v, is_causal=True, chunk_size=chunk_size)
    k2, v2 = k.clone(), v.clone()
    k2[..., cut:, :] = 1e9
    v2[..., cut:, :] = 1e9
    out = linear_attention(q, k2, v2, is_causal=True, chunk_size=chunk_size)
    torch.testing.assert_close(out[..., :cut, :], ref[..., :cut, :])
    naive = linear_attention_naive(q, k2, v2, is_causal=True)
    torch.testing.assert_close(naive[..., :cut, :], ref[..., :cut, :])


def test_zero_normaliser_gives_zero_output_not_nan():
    # relu maps an all-negative query to zero features: the eps keeps the output at 0.
    q, k, v = qkv(6, batch=())
    q[2] = -1.0
    for causal in (False, True):
        out = linear_attention(q, k, v, is_causal=causal, feature_map=relu_feature_map)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[2], torch.zeros(5, dtype=F64))


def test_no_quadratic_intermediate():
    # The non-causal path multiplies (f, e) states; nothing of size i * j is built.
    q, k, v = qkv(4096, d=4, e=4, batch=())
    out = linear_attention(q, k, v)
    assert out.shape == (4096, 4)


# ----------------------------------------------------------------------- recurrent step


@pytest.mark.parametrize("feature_map", [None, relu_feature_map])
def test_step_equals_causal_form(feature_map):
    q, k, v = qkv(21, grad=True)
    state, outs = None, []
    for t in range(21):
        out, state = linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], state, feature_map=feature_map
        )
        outs.append(out)
    stepped = torch.stack(outs, dim=-2)
    causal = linear_attention(
        q, k, v, is_causal=True, chunk_size=8, feature_map=feature_map
    )
    torch.testing.assert_close(stepped, causal)
    for a, b in zip(grads(stepped, (q, k, v)), grads(causal, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_step_state_is_the_running_sum():
    q, k, v = qkv(5, batch=(2,))
    state = None
    for t in range(5):
        _, state = linear_attention_step(q[:, t], k[:, t], v[:, t], state)
    S, z = state
    phi_k = elu_feature_map(k)
    torch.testing.assert_close(S, phi_k.transpose(-2, -1) @ v)  # (b, f, e)
    torch.testing.assert_close(z, phi_k.sum(-2))
    assert S.shape == (2, 8, 5) and z.shape == (2, 8)


def test_step_accepts_a_length_one_axis():
    q, k, v = qkv(4, batch=(3,))
    state, outs = None, []
    for t in range(4):
        out, state = linear_attention_step(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state
        )
        outs.append(out)
    torch.testing.assert_close(
        torch.cat(outs, dim=-2), linear_attention(q, k, v, is_causal=True)
    )


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("chunk_size", [0, -3])
def test_rejects_non_positive_chunk_size(chunk_size):
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match=f"chunk_size must be >= 1, got {chunk_size}"):
        linear_attention(q, k, v, is_causal=True, chunk_size=chunk_size)


def test_rejects_non_integer_chunk_size():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="chunk_size must be an int, got float"):
        linear_attention(q, k, v, chunk_size=2.0)


def test_rejects_mismatched_d():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 8 and 6"
    ):
        linear_attention(q, k[..., :6], v)


def test_rejects_mismatched_positions():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError,
        match="key and value must have the same number of positions j, got 4 and 3",
    ):
        linear_attention(q, k, v[..., :3, :])


def test_rejects_batch_dims_that_do_not_broadcast():
    q, k, v = qkv(4, batch=(2,))
    with pytest.raises(
        ValueError, match="batch dims of query, key and value must broadcast"
    ):
        linear_attention(q, k, torch.zeros(3, 4, 5, dtype=F64))


def test_rejects_mixed_dtypes():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="query and key must share a dtype"):
        linear_attention(q, k.float(), v)


def test_rejects_integer_tensors_and_non_tensors():
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match="query must have a floating-point dtype"):
        linear_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="key must be a torch.Tensor, got list"):
        linear_attention(q, [1.0], v)


@pytest.mark.parametrize("fn", [linear_attention, linear_attention_naive])
def test_rejects_negative_feature_map(fn):
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match="feature_map must be non-negative"):
        fn(q, k, v, feature_map=lambda x: x)


def test_step_rejects_negative_feature_map():
    q, k, v = qkv(1, batch=())
    with pytest.raises(ValueError, match="feature_map must be non-negative"):
        linear_attention_step(q[0], k[0], v[0], feature_map=torch.tanh)


def test_rejects_feature_map_changing_leading_dims():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError, match="feature_map must keep every dimension but the last"
    ):
        linear_attention(q, k, v, feature_map=lambda x: x.abs().sum(0))


def test_rejects_non_callable_feature_map_and_bad_eps():
    q, k, v = qkv(4)
    with pytest.raises(
        TypeError, match="feature_map must be callable or None, got str"
    ):
        linear_attention(q, k, v, feature_map="elu")
    with pytest.raises(ValueError, match="eps must be >= 0, got -1"):
        linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        linear_attention(q, k, v, is_causal=1)


def test_step_rejects_bad_state():
    q, k, v = qkv(2, batch=())
    _, state = linear_attention_step(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="state must have S of shape"):
        linear_attention_step(q[1], k[1], v[1, :3], state)
    with pytest.raises(TypeError, match="state must be None or the pair"):
        linear_attention_step(q[1], k[1], v[1], state[0])
    with pytest.raises(
        ValueError, match="query and key must share their last dimension d, got 8 and 7"
    ):
        linear_attention_step(q[1], k[1, :7], v[1])


# ------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("fn", [linear_attention, linear_attention_naive])
@pytest.mark.parametrize("is_causal", [False, True])
def test_grouped_query_attention_repeats_the_key_value_heads(fn, is_causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 9, 4, generator=g, dtype=F64)
    k, v = (torch.randn(2, 2, 9, 4, generator=g, dtype=F64) for _ in range(2))
    out = fn(q, k, v, is_causal=is_causal, enable_gqa=True)
    ref = fn(
        q,
        k.repeat_interleave(3, dim=1),
        v.repeat_interleave(3, dim=1),
        is_causal=is_causal,
    )
    torch.testing.assert_close(out, ref)
    w = linear_attention_weights(q, k, enable_gqa=True)
    torch.testing.assert_close(
        w, linear_attention_weights(q, k.repeat_interleave(3, dim=1))
    )


@pytest.mark.parametrize("fn", [linear_attention, linear_attention_naive])
def test_attn_mask_and_scale_are_refused_not_ignored(fn):
    q, k, v = qkv(4)
    with pytest.raises(ValueError, match="cannot apply an attn_mask"):
        fn(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(
        ValueError, match="has no scale: the feature map alone sets the similarity"
    ):
        fn(q, k, v, scale=0.5)
    with pytest.raises(TypeError, match="scale must be a float or None, got bool"):
        fn(q, k, v, scale=True)
    with pytest.raises(ValueError, match="cannot apply an attn_mask"):
        linear_attention_weights(q, k, attn_mask=torch.ones(4, 4, dtype=torch.bool))


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_bool_flags_must_be_bools(flag):
    q, k, v = qkv(4)
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        linear_attention(q, k, v, **{flag: "no"})


def test_inputs_on_different_devices_are_refused():
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        linear_attention(q, k, v.to("meta"))
    with pytest.raises(
        ValueError, match="must be on the same device, got cpu and meta"
    ):
        linear_attention_step(q[..., 0, :], k[..., 0, :].to("meta"), v[..., 0, :])


def test_value_none_is_a_type_error():
    q, k, _ = qkv(4)
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got NoneType"):
        linear_attention(q, k, None)


@pytest.mark.parametrize("i, j", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_empty_axes_give_zeros(i, j, is_causal):
    q, k, v = qkv(i, j)
    out = linear_attention(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, i, 5) and (out == 0).all()
    torch.testing.assert_close(
        out, linear_attention_naive(q, k, v, is_causal=is_causal)
    )


def test_zero_head_size_gives_zeros_not_nan():
    # d = 0: no features, so phi(q) . phi(k) = 0 for every pair; eps keeps 0 / 0 away
    q, k, v = qkv(6, d=0)
    for causal in (False, True):
        out = linear_attention(q, k, v, is_causal=causal)
        assert out.shape == (2, 3, 6, 5) and (out == 0).all()


def test_huge_chunk_size_is_clamped():
    q, k, v = qkv(7)
    out = linear_attention(q, k, v, is_causal=True, chunk_size=10**12)
    torch.testing.assert_close(out, linear_attention_naive(q, k, v, is_causal=True))


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_non_finite_values_reach_only_the_rows_that_see_them(poison):
    q, k, v = qkv(10, batch=())
    k2, v2 = k.clone(), v.clone()
    k2[6], v2[6, 0] = poison, poison
    clean = linear_attention(q, k, v, is_causal=True)
    for out in (
        linear_attention(q, k2, v2, is_causal=True, chunk_size=4),
        linear_attention_naive(q, k2, v2, is_causal=True),
    ):
        torch.testing.assert_close(out[:6], clean[:6])  # the future stays out
        assert not out[6:, 0].isfinite().any()
    assert (
        not linear_attention(q, k, v2)[:, 0].isfinite().any()
    )  # non-causal: all see it


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_decayed_chunks_show_a_non_finite_key_only_to_the_rows_after_it(
    poison, normalize, chunk_size
):
    """The rule: row t sees exactly what the recurrence S_t = lambda S_{t-1} + phi(k_t)
    v_t^T has seen, keys and values 0 ... t. A NaN or inf key or value at position 5
    leaves rows 0-4 equal to the step-by-step recurrence and reaches rows 5-6; the
    chunk states carried between chunks must not multiply it by a zero weight."""
    q, k, v = qkv(7, batch=(2,), h=2)
    k[:, :, 5, 1], v[:, :, 5, 0] = poison, poison
    for decay in (-0.1, torch.tensor([-0.1, -0.7], dtype=torch.float64)):
        out = linear_attention(
            q,
            k,
            v,
            is_causal=True,
            decay=decay,
            chunk_size=chunk_size,
            normalize=normalize,
        )
        state, rows = None, []
        for t in range(7):
            row, state = linear_attention_step(
                q[..., t, :],
                k[..., t, :],
                v[..., t, :],
                state,
                decay=decay,
                normalize=normalize,
            )
            rows.append(row)
        torch.testing.assert_close(out[..., :5, :], torch.stack(rows, -2)[..., :5, :])
        assert not out[..., 5:, 0].isfinite().any()


def test_meta_inputs_with_a_float_decay_give_meta_shapes():
    """A float decay is checked as a number, so meta tensors (no values) pass through
    every function that takes one, and a positive decay is still refused."""
    m = torch.empty(2, 6, 4, device="meta")
    for fn in (linear_attention, linear_attention_naive):
        out = fn(m, m, m, is_causal=True, decay=-0.1)
        assert out.device.type == "meta" and out.shape == (2, 6, 4)
    out, (S, z) = linear_attention_step(m[:, 0], m[:, 0], m[:, 0], decay=-0.1)
    assert out.device.type == "meta" and S.shape == (2, 4, 4)
    with pytest.raises(ValueError, match="must be <= 0, got a maximum of 0.5"):
        linear_attention(m, m, m, is_causal=True, decay=0.5)


def test_feature_maps_check_their_input():
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        elu_feature_map(torch.ones(3, dtype=torch.long))
    phi = random_feature_map(4, 8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        phi([1.0, 2.0, 3.0, 4.0])


def test_random_feature_map_checks_its_options():
    with pytest.raises(
        TypeError, match="generator must be a torch.Generator or None, got int"
    ):
        random_feature_map(4, 8, generator=0)
    with pytest.raises(TypeError, match="orthogonal must be a bool"):
        random_feature_map(4, 8, orthogonal="yes")
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        random_feature_map(4, 8, dtype=torch.int64)
    with pytest.raises(TypeError, match="scale must be a float"):
        random_feature_map(4, 8, scale="big")
    with pytest.raises(ValueError, match="num_features must be >= 1, got 0"):
        random_feature_map(4, 0)


def test_step_checks_the_state():
    q, k, v = qkv(2, batch=())
    _, (S, z) = linear_attention_step(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="query and S must share a dtype"):
        linear_attention_step(q[1], k[1], v[1], (S.float(), z))


def test_options_are_keyword_only():
    q, k, v = qkv(4)
    with pytest.raises(TypeError):
        linear_attention(q, k, v, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_zero_normaliser_in_half_precision_gives_zeros(dtype):
    # 0 / (0 + eps) must stay 0 even where 1 / eps overflows the dtype
    q, k, v = (t.to(dtype) for t in qkv(5, d=0))
    for causal in (False, True):
        out = linear_attention(q, k, v, is_causal=causal, chunk_size=2)
        assert (out == 0).all()


def test_eps_is_a_real_number_of_any_size():
    q, k, v = qkv(4)
    torch.testing.assert_close(
        linear_attention(q, k, v, eps=10**30), linear_attention(q, k, v, eps=1e30)
    )
    with pytest.raises(ValueError, match="eps must be >= 0, got nan"):
        linear_attention(q, k, v, eps=float("nan"))


# --------------------------------------------------------------------- decay, Lightning


def decayed_loop(query, key, value, log_decay, feature_map, normalize, eps=1e-6):
    """o_i = sum_{j <= i} lambda^(i - j) phi(q_i).phi(k_j) v_j (/ the same sum of
    phi(q_i).phi(k_j)), one query and one key at a time: the independent reference of
    the decayed forms."""
    phi_q, phi_k = feature_map(query), feature_map(key)
    out = torch.zeros(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
    lam = log_decay.exp()[:, None]  # (h, 1)
    for i in range(query.shape[-2]):
        num = torch.zeros(*query.shape[:-2], value.shape[-1], dtype=query.dtype)
        den = torch.zeros(*query.shape[:-2], 1, dtype=query.dtype)
        for j in range(i + 1):
            w = lam ** (i - j) * (phi_q[..., i, :] * phi_k[..., j, :]).sum(
                -1, keepdim=True
            )
            num, den = num + w * value[..., j, :], den + w
        out[..., i, :] = num / (den + eps) if normalize else num
    return out


LOG_DECAY = torch.tensor(
    [0.0, -0.05, -0.7], dtype=F64
)  # one per head: none, slow, fast


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 13, 64])
def test_decayed_parallel_chunkwise_form_equals_the_loop(normalize, chunk_size):
    q, k, v = qkv(13, d=4, e=3, grad=True)
    fm = elu_feature_map if normalize else (lambda x: x)
    ref = decayed_loop(q, k, v, LOG_DECAY, fm, normalize)
    out = linear_attention(
        q,
        k,
        v,
        is_causal=True,
        chunk_size=chunk_size,
        decay=LOG_DECAY,
        normalize=normalize,
        feature_map=fm,
    )
    torch.testing.assert_close(out, ref)
    naive = linear_attention_naive(
        q, k, v, is_causal=True, decay=LOG_DECAY, normalize=normalize, feature_map=fm
    )
    torch.testing.assert_close(naive, ref)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("normalize", [True, False])
def test_decayed_recurrent_step_equals_the_parallel_form(normalize):
    q, k, v = qkv(9, d=4, e=3)
    fm = elu_feature_map if normalize else (lambda x: x)
    ref = linear_attention(
        q,
        k,
        v,
        is_causal=True,
        chunk_size=4,
        decay=LOG_DECAY,
        normalize=normalize,
        feature_map=fm,
    )
    state, rows = None, []
    for t in range(9):
        out, state = linear_attention_step(
            q[..., t, :],
            k[..., t, :],
            v[..., t, :],
            state,
            decay=LOG_DECAY,
            normalize=normalize,
            feature_map=fm,
        )
        rows.append(out)
    torch.testing.assert_close(torch.stack(rows, dim=-2), ref)


def test_decayed_step_accepts_a_length_one_position_axis():
    q, k, v = qkv(5, d=4, e=3)
    state_a = state_b = None
    for t in range(5):
        out_a, state_a = linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], state_a, decay=LOG_DECAY
        )
        out_b, state_b = linear_attention_step(
            q[..., t : t + 1, :],
            k[..., t : t + 1, :],
            v[..., t : t + 1, :],
            state_b,
            decay=LOG_DECAY,
        )
    torch.testing.assert_close(out_b[..., 0, :], out_a)
    with pytest.raises(ValueError, match="one log-decay per head"):
        linear_attention_step(
            q[0, :, 0, :], k[0, :, 0, :], v[0, :, 0, :], decay=torch.zeros(2, dtype=F64)
        )


def test_zero_decay_and_a_scalar_decay():
    q, k, v = qkv(10)
    plain = linear_attention(q, k, v, is_causal=True, chunk_size=3)
    torch.testing.assert_close(
        linear_attention(
            q, k, v, is_causal=True, chunk_size=3, decay=torch.zeros(3, dtype=F64)
        ),
        plain,
    )
    torch.testing.assert_close(
        linear_attention(q, k, v, is_causal=True, chunk_size=3, decay=-0.2),
        linear_attention(
            q,
            k,
            v,
            is_causal=True,
            chunk_size=3,
            decay=torch.full((3,), -0.2, dtype=F64),
        ),
    )


@pytest.mark.parametrize("log_decay", [-200.0, -math.inf])
def test_strong_decay_keeps_only_the_diagonal(log_decay):
    q, k, v = qkv(7, d=4, e=3)
    out = linear_attention(q, k, v, is_causal=True, chunk_size=3, decay=log_decay)
    lit = lightning_attention(q, k, v, decay=log_decay, block_size=3, scale=1.0)
    torch.testing.assert_close(lit, (q * k).sum(-1, keepdim=True) * v)
    torch.testing.assert_close(
        out,
        v
        / (1 + 1e-6 / (elu_feature_map(q) * elu_feature_map(k)).sum(-1, keepdim=True)),
    )


@pytest.mark.parametrize("block_size", [1, 3, 5, 13, 100])
def test_lightning_block_loop_equals_the_decayed_loop(block_size):
    q, k, v = qkv(13, d=4, e=3, grad=True)
    ref = decayed_loop(
        q * 0.5, k, v, LOG_DECAY, lambda x: x, False
    )  # default scale 4 ** -0.5
    out = lightning_attention(q, k, v, decay=LOG_DECAY, block_size=block_size)
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b)


def test_lightning_gradcheck_and_state_chaining():
    q, k, v = qkv(6, d=3, e=2, batch=(1, 3), grad=True)
    decay = (
        LOG_DECAY - 0.01
    ).requires_grad_()  # inside the valid range for the differences
    assert torch.autograd.gradcheck(
        lambda q, k, v, g: lightning_attention(q, k, v, decay=g, block_size=4),
        (q, k, v, decay),
    )
    q, k, v = qkv(11, d=4, e=3)
    whole, final = lightning_attention(
        q, k, v, decay=LOG_DECAY, block_size=4, output_final_state=True
    )
    first, mid = lightning_attention(
        q[..., :5, :],
        k[..., :5, :],
        v[..., :5, :],
        decay=LOG_DECAY,
        block_size=4,
        output_final_state=True,
    )
    second, end = lightning_attention(
        q[..., 5:, :],
        k[..., 5:, :],
        v[..., 5:, :],
        decay=LOG_DECAY,
        block_size=4,
        initial_state=mid,
        output_final_state=True,
    )
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(end, final)
    # the state is the step's S, read with the scale
    state = None
    for t in range(11):
        _, state = linear_attention_step(
            q[..., t, :],
            k[..., t, :],
            v[..., t, :],
            state,
            decay=LOG_DECAY,
            normalize=False,
            feature_map=lambda x: x,
        )
    torch.testing.assert_close(state[0], final)


def test_lightning_grouped_query_heads():
    q = qkv(8, batch=(1, 4))[0]
    _, k, v = qkv(8, batch=(1, 2))
    out = lightning_attention(q, k, v, enable_gqa=True, decay=-0.1, block_size=3)
    ref = lightning_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), decay=-0.1
    )
    torch.testing.assert_close(out, ref)


def test_decay_bad_input():
    q, k, v = qkv(6)
    with pytest.raises(ValueError, match="must be <= 0"):
        linear_attention(q, k, v, is_causal=True, decay=0.1)
    with pytest.raises(ValueError, match="needs an order: pass is_causal=True"):
        linear_attention(q, k, v, decay=-0.1)
    with pytest.raises(ValueError, match=r"one log-decay per head, shape \(3,\)"):
        linear_attention(q, k, v, is_causal=True, decay=torch.zeros(2, dtype=F64))
    with pytest.raises(TypeError, match="normalize must be a bool"):
        linear_attention(q, k, v, is_causal=True, normalize=0)
    with pytest.raises(ValueError, match="must be <= 0"):
        lightning_attention(q, k, v, decay=torch.tensor([0.0, 0.1, 0.0], dtype=F64))
    with pytest.raises(ValueError, match="causal only"):
        lightning_attention(q, k, v, is_causal=False)
    with pytest.raises(ValueError, match="cannot apply an attn_mask"):
        lightning_attention(q, k, v, attn_mask=torch.ones(6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="same length n"):
        lightning_attention(q, *qkv(6, 4)[1:])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        lightning_attention(q, k, v, initial_state=torch.zeros(3, 8, 5, dtype=F64))
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        lightning_attention(q, k, v, block_size=0)
