"""Tests for attention/delta_rule.py: the recurrence and the chunkwise WY/UT form
against an independent reference re-derived from flash-linear-attention's naive
recurrent rules, float64 gradients, state chaining and the boundary checks; Kimi Delta
Attention against a naive loop and against fla-core's own naive functions. (What the
whole recurrent family shares is in tests/test_recurrent_contract.py.)"""

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import (
    delta_rule_attention,
    gated_delta_rule_attention,
    kimi_delta_attention,
)

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
    """Re-derived from fla's naive recurrent (gated) delta rule, in fla's (b, n, h, d)
    layout.

    Per token: decay the (d, e) state by exp(g); read the old value stored under k (sum
    over d of state * k); write beta * (v - old) along k; output = state^T (scale q).
    Written here in the product form S <- alpha (I - beta k k^T) S + beta k v^T, which
    is the same step rearranged, so the test does not repeat the package's arithmetic.
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


# ---------------------------------------------------------------- Kimi Delta Attention


def kda_inputs(n=11, d=4, e=3, h=2, group=2, batch=(2,), seed=0, grad=False, dtype=F64):
    """query/key ``(*batch, h, n, d)``; value ``(*batch, h * group, n, e)``; g, beta,
    s0 per value head. Keys unit-norm, as KDA's layer makes them."""
    gen = torch.Generator().manual_seed(seed)
    h_v = h * group
    q = torch.randn(*batch, h, n, d, generator=gen, dtype=F64)
    k = torch.randn(*batch, h, n, d, generator=gen, dtype=F64)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(*batch, h_v, n, e, generator=gen, dtype=F64)
    g = -2 * torch.rand(*batch, h_v, n, d, generator=gen, dtype=F64)
    beta = torch.rand(*batch, h_v, n, generator=gen, dtype=F64)
    s0 = torch.randn(*batch, h_v, d, e, generator=gen, dtype=F64)
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v, g, beta, s0)]


def naive_kda(q, k, v, g, beta, scale, s0):
    """Token by token, in the product form
    S <- (I - beta k k^T) Diag(exp g) S + beta k v^T, o = S^T (scale q);
    value head j reads query/key head j // G (grouped value heads)."""
    h, h_v, d = q.shape[-3], v.shape[-3], q.shape[-1]
    kv_head = torch.arange(h_v) // (h_v // h)  # the query/key head of each value head
    q, k = q[..., kv_head, :, :], k[..., kv_head, :, :]  # (..., h_v, n, d)
    eye = torch.eye(d, dtype=q.dtype)
    state, outs = s0, []
    for t in range(q.shape[-2]):
        kt, bt = k[..., t, :], beta[..., t, None, None]
        forget = torch.diag_embed(g[..., t, :].exp())  # (..., h_v, d, d)
        outer = kt.unsqueeze(-1) * kt.unsqueeze(-2)  # (..., h_v, d, d)
        state = (eye - bt * outer) @ forget @ state + bt * kt.unsqueeze(-1) * v[
            ..., t, None, :
        ]
        read = state.transpose(-2, -1) @ (scale * q[..., t, :, None])  # (.., h_v, e, 1)
        outs.append(read.squeeze(-1))
    return torch.stack(outs, dim=-2), state


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 4, 11, 16])
def test_kda_both_forms_equal_a_naive_loop(group, chunk_size):
    q, k, v, g, beta, s0 = kda_inputs(group=group)
    ref, ref_state = naive_kda(q, k, v, g, beta, 0.5, s0)
    out, state = kimi_delta_attention(
        q,
        k,
        v,
        g,
        beta,
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)
    assert out.shape == (2, 2 * group, 11, 3) and state.shape == (2, 2 * group, 4, 3)


def test_kda_with_one_decay_per_head_is_the_gated_delta_rule():
    q, k, v, g, beta, s0 = kda_inputs()
    per_head = g[..., 0]  # (b, h_v, n)
    same = per_head.unsqueeze(-1).expand(g.shape)  # every channel the same decay
    q2, k2 = q.repeat_interleave(2, dim=1), k.repeat_interleave(2, dim=1)
    for chunk in (None, 4):
        torch.testing.assert_close(
            kimi_delta_attention(
                q, k, v, same, beta, initial_state=s0, chunk_size=chunk
            ),
            gated_delta_rule_attention(q2, k2, v, beta, per_head, initial_state=s0),
        )
    # and with g = 0 it is the delta rule
    torch.testing.assert_close(
        kimi_delta_attention(q, k, v, torch.zeros_like(g), beta, chunk_size=5),
        delta_rule_attention(q2, k2, v, beta),
    )


def test_kda_decay_is_per_channel():
    # a channel that never decays keeps its row of the state; a forgetting one loses it
    q, k, v, g, beta, s0 = kda_inputs(group=1)
    g = torch.zeros_like(g)
    g[..., 1] = -math.inf  # channel 1 forgets everything at every step
    _, state = kimi_delta_attention(
        q,
        k,
        v,
        g,
        torch.zeros_like(beta),
        initial_state=s0,
        output_final_state=True,
        chunk_size=4,
    )
    torch.testing.assert_close(state[..., 0, :], s0[..., 0, :])
    assert not state[..., 1, :].any()


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_kda_splitting_the_sequence_and_passing_the_state_gives_the_whole(chunk_size):
    q, k, v, g, beta, s0 = kda_inputs(n=13)
    whole, final = kimi_delta_attention(
        q,
        k,
        v,
        g,
        beta,
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    cut = 6
    first, mid = kimi_delta_attention(
        *(t[..., :cut, :] for t in (q, k, v, g)),
        beta[..., :cut],
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    second, end = kimi_delta_attention(
        *(t[..., cut:, :] for t in (q, k, v, g)),
        beta[..., cut:],
        initial_state=mid,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(end, final)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_kda_gradients_match_finite_differences(chunk_size):
    q, k, v, g, beta, s0 = kda_inputs(
        n=5, d=3, e=2, h=1, group=2, batch=(1,), grad=True
    )
    # beta inside (0, 1) and g < 0, so that finite differences stay in the valid range
    beta_in = (0.1 + 0.8 * beta.detach()).requires_grad_()
    g_in = (g.detach() - 0.05).requires_grad_()

    def fn(q, k, v, g, beta, s0):
        return kimi_delta_attention(
            q,
            k,
            v,
            g,
            beta,
            initial_state=s0,
            output_final_state=True,
            chunk_size=chunk_size,
        )

    assert torch.autograd.gradcheck(fn, (q, k, v, g_in, beta_in, s0))


def test_kda_chunkwise_gradients_equal_recurrent_gradients():
    q, k, v, g, beta, s0 = kda_inputs(n=9, grad=True)
    w = torch.randn(2, 4, 9, 3, generator=torch.Generator().manual_seed(5), dtype=F64)
    grads = []
    for chunk in (None, 4):
        out = kimi_delta_attention(q, k, v, g, beta, initial_state=s0, chunk_size=chunk)
        grads.append(torch.autograd.grad((out * w).sum(), (q, k, v, g, beta, s0)))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_kda_float32_is_close_to_float64(chunk_size):
    args = kda_inputs(dtype=torch.float32)
    out = kimi_delta_attention(*args[:5], initial_state=args[5], chunk_size=chunk_size)
    assert out.dtype == torch.float32
    exact = kimi_delta_attention(
        *(t.double() for t in args[:5]), initial_state=args[5].double()
    )
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5)


def test_kda_strong_decays_do_not_overflow_the_chunkwise_form():
    # g down to -60 per step: a chunk of 16 accumulates up to -960, whose exp(+960)
    # overflows float32 (and float64) in a factorised exp(gamma_r) exp(-gamma_s) form
    q, k, v, g, beta, s0 = kda_inputs(n=20)
    g = 30 * g  # in [-60, 0]
    exact = kimi_delta_attention(q, k, v, g, beta, initial_state=s0)
    out = kimi_delta_attention(
        *(t.float() for t in (q, k, v, g, beta)),
        initial_state=s0.float(),
        chunk_size=16,
    )
    assert out.isfinite().all()
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [None, 8])
def test_kda_a_decay_of_zero_forgets_everything_before_it(chunk_size):
    q, k, v, g, beta, s0 = kda_inputs(n=10)
    g = g.clone()
    g[..., 4, :] = -math.inf  # alpha = 0 in every channel at position 4
    out = kimi_delta_attention(
        q, k, v, g, beta, initial_state=s0, chunk_size=chunk_size
    )
    assert out.isfinite().all()
    g_after = g[..., 4:, :].clone()
    g_after[..., 0, :] = 0.0  # from a zero state, forgetting it changes nothing
    after = kimi_delta_attention(
        q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], g_after, beta[..., 4:]
    )
    torch.testing.assert_close(out[..., 4:, :], after)


@settings(max_examples=25)
@given(
    n=st.integers(0, 12),
    chunk=st.integers(1, 9),
    d=st.integers(1, 4),
    group=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_property_kda_chunkwise_equals_recurrent(n, chunk, d, group, seed):
    q, k, v, g, beta, s0 = kda_inputs(n=n, d=d, e=2, h=1, group=group, seed=seed)
    ref, ref_state = kimi_delta_attention(
        q, k, v, g, beta, initial_state=s0, output_final_state=True
    )
    out, state = kimi_delta_attention(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=chunk
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(state, ref_state)


class _TorchKeepingFloat64(types.ModuleType):
    """``torch`` as fla's naive module sees it, with ``torch.float`` meaning float64.

    fla's naive functions cast every input to ``torch.float`` (float32, the accumulation
    dtype of its kernels) and would compare at float32 precision only; given this module
    as their ``torch``, the same code runs in float64. Nothing else changes.
    """

    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _fla_layout(*tensors):
    """(b, h, n, ...) -> fla's (b, n, h, ...)."""
    return [t.transpose(1, 2) for t in tensors]


@pytest.fixture
def fla_kda(monkeypatch):
    naive = pytest.importorskip("fla.ops.kda.naive")  # fla-core, a test-only dependency
    monkeypatch.setattr(naive, "torch", _TorchKeepingFloat64("torch"))
    return naive


@pytest.mark.slow  # imports fla: make test, not make check
@pytest.mark.parametrize("n", [1, 7, 13])
@pytest.mark.parametrize("chunk_size", [None, 4, 5])
def test_kda_equals_fla_naive_recurrent_kda_in_float64(fla_kda, n, chunk_size):
    q, k, v, g, beta, s0 = kda_inputs(n=n, d=4, e=3, h=2, group=2)
    ref, ref_state = fla_kda.naive_recurrent_kda(
        *_fla_layout(q, k, v, g, beta), initial_state=s0, output_final_state=True
    )
    assert ref.dtype == ref_state.dtype == F64
    out, state = kimi_delta_attention(
        q,
        k,
        v,
        g,
        beta,
        initial_state=s0,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=1e-10)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-10)
    # fla's default scale is ours too
    torch.testing.assert_close(
        kimi_delta_attention(q, k, v, g, beta, scale=0.3, chunk_size=chunk_size),
        fla_kda.naive_recurrent_kda(*_fla_layout(q, k, v, g, beta), scale=0.3)[
            0
        ].transpose(1, 2),
        rtol=0,
        atol=1e-10,
    )


@pytest.mark.slow  # imports fla: make test, not make check
def test_kda_equals_fla_naive_chunk_kda_in_float64(fla_kda):
    # fla's chunk reference needs n to be a multiple of its chunk: pad n = 13 to 16 with
    # beta = 0, g = 0 positions, which leave the state unchanged (our own padding rule)
    q, k, v, g, beta, s0 = kda_inputs(n=13, h=2, group=2)
    padded = [torch.nn.functional.pad(t, (0, 0, 0, 3)) for t in (q, k, v, g)]
    ref, ref_state = fla_kda.naive_chunk_kda(
        *_fla_layout(*padded, torch.nn.functional.pad(beta, (0, 3))),
        initial_state=s0,
        output_final_state=True,
        chunk_size=4,
    )
    out, state = kimi_delta_attention(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=4
    )
    ref = ref.transpose(1, 2)[..., :13, :]  # back to (b, h_v, n, e), padding cut
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-10)


@pytest.mark.slow  # imports fla: make test, not make check
def test_kda_equals_fla_as_shipped_in_float32():
    # without the float64 patch: fla computes in float32 whatever the input dtype
    naive = pytest.importorskip("fla.ops.kda.naive")
    q, k, v, g, beta, s0 = kda_inputs(n=9, h=2, group=2, dtype=torch.float32)
    ref, ref_state = naive.naive_recurrent_kda(
        *_fla_layout(q, k, v, g, beta), initial_state=s0, output_final_state=True
    )
    out, state = kimi_delta_attention(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=4
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ KDA bad input


def test_kda_shape_errors():
    q, k, v, g, beta, s0 = kda_inputs()
    with pytest.raises(ValueError, match="query and key must have the same shape"):
        kimi_delta_attention(q[..., :3], k, v, g, beta)
    with pytest.raises(ValueError, match=r"h_v a multiple of h \(grouped value"):
        kimi_delta_attention(q, k, v[:, :3], g[:, :3], beta[:, :3])
    with pytest.raises(ValueError, match="the same batch dims and n"):
        kimi_delta_attention(q, k, v[..., :5, :], g[..., :5, :], beta[..., :5])
    per_channel = r"g must have shape \(\.\.\., h_v, n, d\) = \(2, 4, 11, 4\), one"
    with pytest.raises(ValueError, match=per_channel):
        kimi_delta_attention(q, k, v, g[..., 0], beta)  # one decay per head: not KDA
    with pytest.raises(ValueError, match=r"beta must have shape \(\.\.\., h_v, n\)"):
        kimi_delta_attention(q, k, v, g, beta[:, :2])
    state_shape = r"initial_state must have shape \(\.\.\., d, e\) = \(2, 4, 4, 3\)"
    with pytest.raises(ValueError, match=state_shape):
        kimi_delta_attention(q, k, v, g, beta, initial_state=s0[:, :2])
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        kimi_delta_attention(q, k, v, g, beta, chunk_size=0)


def test_kda_value_errors():
    q, k, v, g, beta, _ = kda_inputs()
    growth = g.clone()
    growth[0, 1, 2, 3] = 0.5
    with pytest.raises(ValueError, match="must be <= 0, got a maximum of 0.5"):
        kimi_delta_attention(q, k, v, growth, beta)
    for bad in (-0.1, 1.5):
        wrong = beta.clone()
        wrong[0, 0, 0] = bad
        with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
            kimi_delta_attention(q, k, v, g, wrong)


def test_kda_type_dtype_and_device_errors():
    q, k, v, g, beta, s0 = kda_inputs()
    with pytest.raises(TypeError, match="g must be a torch.Tensor, got list"):
        kimi_delta_attention(q, k, v, g.tolist(), beta)
    with pytest.raises(TypeError, match="g must be a tensor"):
        kimi_delta_attention(q, k, v, None, beta)
    with pytest.raises(TypeError, match="initial_state must be a torch.Tensor, got"):
        kimi_delta_attention(q, k, v, g, beta, initial_state=s0.tolist())
    with pytest.raises(
        TypeError,
        match="query and g must share a dtype, got torch.float64 and torch.float32",
    ):
        kimi_delta_attention(q, k, v, g.float(), beta)
    with pytest.raises(TypeError, match="query and initial_state must share a dtype"):
        kimi_delta_attention(q, k, v, g, beta, initial_state=s0.float())
    with pytest.raises(
        ValueError, match="query and beta must be on the same device, got cpu and meta"
    ):
        kimi_delta_attention(q, k, v, g, beta.to("meta"))
    with pytest.raises(TypeError, match="beta must have a floating-point dtype"):
        kimi_delta_attention(q, k, v, g, (beta > 0.5).long())
    with pytest.raises(TypeError, match="output_final_state must be a bool"):
        kimi_delta_attention(q, k, v, g, beta, output_final_state="yes")
    with pytest.raises(TypeError, match="scale must be a float or None"):
        kimi_delta_attention(q, k, v, g, beta, scale=True)
