"""Tests for attention/efficient/delta_rule.py: the recurrence and the chunkwise WY/UT form against an
independent reference re-derived from flash-linear-attention's naive recurrent rules, float64
gradients, state chaining and the boundary checks."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import delta_rule_attention, gated_delta_rule_attention

F64 = torch.float64


def inputs(
    n=11, d=4, e=3, batch=(2, 3), seed=0, normalize=True, grad=False, decay=True
):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, d, generator=g, dtype=F64)
    k = torch.randn(*batch, n, d, generator=g, dtype=F64)
    if normalize:  # DeltaNet normalises the keys before the call
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(*batch, n, e, generator=g, dtype=F64)
    beta = torch.rand(*batch, n, generator=g, dtype=F64)
    log_alpha = -torch.rand(*batch, n, generator=g, dtype=F64) if decay else None
    s0 = torch.randn(*batch, d, e, generator=g, dtype=F64)
    out = [q, k, v, beta, log_alpha, s0]
    return [t.requires_grad_(grad) if t is not None else None for t in out]


def fla_reference(q, k, v, beta, g, scale, s0):
    """Re-derived from fla's naive recurrent (gated) delta rule, in fla's (b, n, h, d) layout.

    Per token: decay the (d, e) state by exp(g); read the old value stored under k
    (sum over d of state * k); write beta * (v - old) along k; output = state^T (scale q).
    Written here in the product form S <- alpha (I - beta k k^T) S + beta k v^T, which is the
    same step rearranged, so the test does not repeat the package's arithmetic.
    """
    q, k, v = (
        x.transpose(-3, -2) for x in (q, k, v)
    )  # (..., n, h, *) as fla lays them out
    beta = beta.transpose(-2, -1)
    g = torch.zeros_like(beta) if g is None else g.transpose(-2, -1)
    d = q.shape[-1]
    eye = torch.eye(d, dtype=q.dtype)
    state = s0.clone()
    outs = []
    for t in range(q.shape[-3]):
        kt, vt, bt = k[..., t, :, :], v[..., t, :, :], beta[..., t, :, None, None]
        at = g[..., t, :, None, None].exp()
        outer = kt.unsqueeze(-1) * kt.unsqueeze(-2)  # (..., h, d, d)
        state = at * (eye - bt * outer) @ state + bt * kt.unsqueeze(-1) * vt.unsqueeze(
            -2
        )
        outs.append(torch.einsum("...hd,...hde->...he", q[..., t, :, :] * scale, state))
    return torch.stack(outs, dim=-3).transpose(-3, -2), state


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 4, 11, 16])
def test_both_forms_equal_the_fla_reference_with_state(gated, chunk_size):
    q, k, v, beta, g, s0 = inputs(decay=gated)
    ref, ref_state = fla_reference(q, k, v, beta, g, 4**-0.5, s0)
    args = (q, k, v, beta, g) if gated else (q, k, v, beta)
    fn = gated_delta_rule_attention if gated else delta_rule_attention
    out, state = fn(
        *args, initial_state=s0, output_final_state=True, chunk_size=chunk_size
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


def test_default_scale_is_inverse_sqrt_d_and_scale_multiplies_the_query():
    q, k, v, beta, g, _ = inputs(d=9)
    ref, _ = fla_reference(q, k, v, beta, g, 1 / 3, torch.zeros(2, 3, 9, 3, dtype=F64))
    torch.testing.assert_close(gated_delta_rule_attention(q, k, v, beta, g), ref)
    torch.testing.assert_close(
        gated_delta_rule_attention(q, k, v, beta, g, scale=0.7),
        gated_delta_rule_attention(0.7 * 3 * q, k, v, beta, g),
    )


def test_keys_are_not_normalised_inside():
    q, k, v, beta, g, s0 = inputs(normalize=False)
    ref, _ = fla_reference(q, k, v, beta * 0.1, g, 0.5, s0)
    out = gated_delta_rule_attention(
        q, k, v, beta * 0.1, g, initial_state=s0, chunk_size=5
    )
    torch.testing.assert_close(out, ref)


def test_gated_with_zero_log_decay_is_the_delta_rule():
    q, k, v, beta, g, s0 = inputs()
    torch.testing.assert_close(
        gated_delta_rule_attention(
            q, k, v, beta, torch.zeros_like(g), initial_state=s0
        ),
        delta_rule_attention(q, k, v, beta, initial_state=s0),
    )


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_splitting_the_sequence_and_passing_the_state_gives_the_whole(chunk_size):
    q, k, v, beta, g, s0 = inputs(n=13)
    whole, final = gated_delta_rule_attention(
        q,
        k,
        v,
        beta,
        g,
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    cut = 6
    first, mid = gated_delta_rule_attention(
        q[..., :cut, :],
        k[..., :cut, :],
        v[..., :cut, :],
        beta[..., :cut],
        g[..., :cut],
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    second, end = gated_delta_rule_attention(
        q[..., cut:, :],
        k[..., cut:, :],
        v[..., cut:, :],
        beta[..., cut:],
        g[..., cut:],
        initial_state=mid,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(end, final)


def test_orthonormal_keys_with_beta_one_store_and_overwrite_exactly():
    keys = torch.eye(4, dtype=F64)[[0, 1, 2, 0]]  # key 0 written twice
    values = torch.arange(12, dtype=F64).reshape(4, 3)
    _, state = delta_rule_attention(
        keys, keys, values, torch.ones(4, dtype=F64), output_final_state=True
    )
    # the delta rule replaces the first value under key 0; a Hebbian sum would add them
    torch.testing.assert_close(state[:3], values[[3, 1, 2]])


def test_beta_zero_leaves_the_state_and_only_decays_it():
    q, k, v, _, g, s0 = inputs()
    out, state = gated_delta_rule_attention(
        q,
        k,
        v,
        torch.zeros_like(g),
        g,
        initial_state=s0,
        output_final_state=True,
        chunk_size=3,
    )
    torch.testing.assert_close(state, s0 * g.sum(-1).exp()[..., None, None])


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_gradients_match_finite_differences(chunk_size):
    q, k, v, beta, g, s0 = inputs(n=5, d=3, e=2, batch=(1, 2), grad=True)
    # beta inside (0, 1) and g < 0 so that finite differences stay in the valid range
    beta_in = (0.1 + 0.8 * beta.detach()).requires_grad_()
    g_in = (g.detach() - 0.05).requires_grad_()

    def fn(q, k, v, beta, g, s0):
        out, state = gated_delta_rule_attention(
            q,
            k,
            v,
            beta,
            g,
            initial_state=s0,
            output_final_state=True,
            chunk_size=chunk_size,
        )
        return out, state

    assert torch.autograd.gradcheck(fn, (q, k, v, beta_in, g_in, s0))


def test_chunkwise_gradients_equal_recurrent_gradients():
    q, k, v, beta, g, s0 = inputs(n=9, grad=True)
    w = torch.randn(2, 3, 9, 3, generator=torch.Generator().manual_seed(5), dtype=F64)
    grads = []
    for chunk in (None, 4):
        out = gated_delta_rule_attention(
            q, k, v, beta, g, initial_state=s0, chunk_size=chunk
        )
        grads.append(torch.autograd.grad((out * w).sum(), (q, k, v, beta, g, s0)))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_float32_and_empty_sequence():
    q, k, v, beta, g, _ = (t.float() if t is not None else None for t in inputs())
    out = gated_delta_rule_attention(q, k, v, beta, g, chunk_size=4)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 11, 3)
    exact = gated_delta_rule_attention(
        q.double(), k.double(), v.double(), beta.double(), g.double()
    )
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5)
    empty, state = delta_rule_attention(
        q[..., :0, :],
        k[..., :0, :],
        v[..., :0, :],
        beta[..., :0],
        output_final_state=True,
    )
    assert empty.shape == (2, 3, 0, 3) and not state.any()


def test_nan_beta_propagates_like_torch():
    q, k, v, beta, _, _ = inputs()
    beta = beta.clone()
    beta[0, 0, 2] = math.nan
    out = delta_rule_attention(q, k, v, beta)
    assert out[0, 0, 2:].isnan().all() and not out[0, 0, :2].isnan().any()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_beta_outside_zero_one_is_refused(bad):
    q, k, v, beta, _, _ = inputs()
    beta = beta.clone()
    beta[0, 0, 0] = bad
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        delta_rule_attention(q, k, v, beta)


def test_positive_log_decay_is_refused():
    q, k, v, beta, g, _ = inputs()
    with pytest.raises(ValueError, match="must be <= 0"):
        gated_delta_rule_attention(q, k, v, beta, g + 1.0)


def test_shape_errors():
    q, k, v, beta, g, s0 = inputs()
    with pytest.raises(ValueError, match="query and key must have the same shape"):
        delta_rule_attention(q[..., :3], k, v, beta)
    with pytest.raises(ValueError, match="value must have the shape"):
        delta_rule_attention(q, k, v[..., :5, :], beta)
    with pytest.raises(ValueError, match=r"beta must have shape \(\.\.\., n\)"):
        delta_rule_attention(q, k, v, beta[..., :5])
    with pytest.raises(ValueError, match=r"g must have shape \(\.\.\., n\)"):
        gated_delta_rule_attention(q, k, v, beta, g[..., :5])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        delta_rule_attention(q, k, v, beta, initial_state=s0[..., :2])
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        delta_rule_attention(q, k, v, beta, chunk_size=0)


def test_dtype_and_type_errors():
    q, k, v, beta, g, _ = inputs()
    with pytest.raises(TypeError, match="must share a dtype"):
        delta_rule_attention(q, k, v.float(), beta)
    with pytest.raises(TypeError, match="floating-point"):
        delta_rule_attention(q, k, v, (beta > 0.5).long())
    with pytest.raises(TypeError, match="output_final_state must be a bool"):
        delta_rule_attention(q, k, v, beta, output_final_state=1)
    with pytest.raises(TypeError, match="g must be a tensor"):
        gated_delta_rule_attention(q, k, v, beta, None)


@settings(max_examples=25)
@given(
    n=st.integers(0, 12),
    chunk=st.integers(1, 9),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_property_chunkwise_equals_recurrent(n, chunk, d, seed):
    q, k, v, beta, g, s0 = inputs(n=n, d=d, e=2, batch=(2,), seed=seed)
    ref, ref_state = gated_delta_rule_attention(
        q, k, v, beta, g, initial_state=s0, output_final_state=True
    )
    out, state = gated_delta_rule_attention(
        q, k, v, beta, g, initial_state=s0, output_final_state=True, chunk_size=chunk
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)


def test_a_decay_of_zero_forgets_everything_before_it_in_both_forms():
    q, k, v, beta, g, s0 = inputs(n=10)
    g = g.clone()
    g[..., 4] = -math.inf  # alpha = 0 at position 4
    ref, ref_state = gated_delta_rule_attention(
        q, k, v, beta, g, initial_state=s0, output_final_state=True
    )
    out, state = gated_delta_rule_attention(
        q, k, v, beta, g, initial_state=s0, output_final_state=True, chunk_size=8
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)
    g_after = g[..., 4:].clone()
    g_after[..., 0] = 0.0  # from a zero state, forgetting it changes nothing
    after = gated_delta_rule_attention(
        q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], beta[..., 4:], g_after
    )
    torch.testing.assert_close(
        ref[..., 4:, :], after
    )  # nothing before position 4 survives
