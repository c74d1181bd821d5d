"""Checkers for chapter 7's exercises: sinusoidal encodings, a RoPE rotation, ALiBi's
bias and Llama 3.1's frequency scaling, each written by you.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch07
    ch07.check_rope(my_rope)

Every input is float64; the tolerance is stated in the ``✓`` line. The traps of this
chapter are conventions: which features form a pair (the two RoPE layouts), which
frequency comes first, the sign of a bias, the slopes of ALiBi's heads, which side of a
band Llama 3.1 keeps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..layers.positional import (
    alibi_bias,
    apply_rope,
    rope_frequencies,
    sinusoidal_positions,
)
from ._checker import Case, Mistake, Property, check, randn

__all__ = [
    "check_sinusoidal",
    "check_rope",
    "check_alibi_bias",
    "check_llama3_frequencies",
]

_F64 = torch.float64


def _frequencies(d: int, base: float, dtype=_F64) -> Tensor:
    """``base^(-2k/d)`` for the ``d/2`` pairs, in ``dtype``."""
    return base ** -(torch.arange(0, d, 2, dtype=dtype) / d)


# --------------------------------------------------------------------------- sinusoids


def _sinusoidal(n, d, base=10000.0):
    return sinusoidal_positions(n, d, base=base, dtype=_F64)


def _sin_cos_swapped(n, d, base=10000.0):
    angles = torch.arange(n, dtype=_F64)[:, None] * _frequencies(d, base)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).reshape(n, d)


def _sin_block_then_cos_block(n, d, base=10000.0):
    angles = torch.arange(n, dtype=_F64)[:, None] * _frequencies(d, base)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def _exponent_k_over_d(n, d, base=10000.0):
    theta = base ** -(torch.arange(d // 2, dtype=_F64) / d)
    angles = torch.arange(n, dtype=_F64)[:, None] * theta
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(n, d)


def _slowest_first(n, d, base=10000.0):
    angles = torch.arange(n, dtype=_F64)[:, None] * _frequencies(d, base).flip(0)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(n, d)


def _positions_from_one(n, d, base=10000.0):
    return sinusoidal_positions(n + 1, d, base=base, dtype=_F64)[1:]


def _sinusoidal_float32(n, d, base=10000.0):
    theta = base ** -(torch.arange(0, d, 2) / d)  # float32: an integer arange over d
    angles = torch.arange(n)[:, None] * theta
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(n, d)


def _unit_pairs(out, n, d, base=10000.0):
    """sin^2 + cos^2 = 1 in every pair (2k, 2k+1)."""
    return (out[:, 0::2] ** 2 + out[:, 1::2] ** 2 - 1).abs() <= 1e-9


def check_sinusoidal(fn) -> None:
    r"""Check ``fn(n, d, base=10000.0)``: the Transformer's sinusoidal encodings.

    .. math:: PE_{p,\,2k} = \sin(p\,\theta_k), \quad PE_{p,\,2k+1} = \cos(p\,\theta_k),
        \quad \theta_k = \text{base}^{-2k/d}

    ``fn`` returns a float64 tensor ``(n, d)``: row ``p`` for position ``p = 0 ...
    n-1``, sine and cosine interleaved. The inputs: small and larger ``n`` and ``d``,
    ``d = 2`` and another base. Known mistakes are named: sine and cosine swapped, a
    sine block then a cosine block (the drawing's layout, not the formula's), the
    exponent ``k/d`` instead of ``2k/d``, the slowest pair first, positions counted from
    1, float32 frequencies. Tolerance: 1e-10.

    Example:
        >>> def my_sinusoidal(n, d, base=10000.0):
        ...     theta = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        ...     angles = torch.arange(n, dtype=torch.float64)[:, None] * theta
        ...     return torch.stack((angles.sin(), angles.cos()), -1).reshape(n, d)
        >>> check_sinusoidal(my_sinusoidal)  # doctest: +ELLIPSIS
        ✓ my_sinusoidal: sinusoidal encodings, sin and cos interleaved (4 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _sinusoidal,
        [
            Case("n = 4 positions, d = 6", (4, 6)),
            Case("n = 50, d = 16", (50, 16)),
            Case("d = 2 (one pair)", (7, 2)),
            Case("base = 100", (12, 8), {"base": 100.0}),
        ],
        what="sinusoidal encodings, sin and cos interleaved",
        properties=[
            Property(
                "every pair (2k, 2k+1) must be (sin, cos) of one angle", _unit_pairs
            )
        ],
        mistakes=[
            Mistake(
                "sine and cosine are swapped: even features 2k hold sin(p theta_k), "
                "odd features 2k+1 hold cos",
                _sin_cos_swapped,
            ),
            Mistake(
                "the sines come as one block and the cosines as another: interleave "
                "them, feature 2k = sin, feature 2k+1 = cos of the same angle",
                _sin_block_then_cos_block,
            ),
            Mistake(
                "the exponent is k/d: theta_k = base^(-2k/d), with 2k the even "
                "feature index (torch.arange(0, d, 2) / d)",
                _exponent_k_over_d,
            ),
            Mistake(
                "the frequencies are in reverse order: pair 0 is the fastest, "
                "theta_0 = 1, and they fall towards base^(-(d-2)/d)",
                _slowest_first,
            ),
            Mistake(
                "the positions start at 1: row p is position p, and row 0 is "
                "sin 0 = 0, cos 0 = 1",
                _positions_from_one,
            ),
            Mistake(
                "the result is float32: make the aranges float64 "
                "(torch.arange(..., dtype=torch.float64))",
                _sinusoidal_float32,
            ),
        ],
    )


# --------------------------------------------------------------------------- RoPE


def _rope(x, positions, base=10000.0):
    return apply_rope(x, positions, base=base)


def _angles(x, positions, base, dtype=_F64):
    return positions.to(dtype)[:, None] * _frequencies(x.shape[-1], base, dtype)


def _rope_interleaved(x, positions, base=10000.0):
    return apply_rope(x, positions, base=base, interleaved=True)


def _half_split(x, angles):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _rope_backwards(x, positions, base=10000.0):
    return _half_split(x, -_angles(x, positions, base))


def _rope_slowest_first(x, positions, base=10000.0):
    return _half_split(x, _angles(x, positions, base).flip(-1))


def _rope_positions_ignored(x, positions, base=10000.0):
    return apply_rope(x, torch.arange(x.shape[-2]), base=base)


def _rope_exponent_k_over_d(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** -(torch.arange(d // 2, dtype=_F64) / d)
    return _half_split(x, positions.to(_F64)[:, None] * theta)


def _rope_float32_angles(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** -(torch.arange(0, d, 2) / d)  # float32: an integer arange over d
    return _half_split(x, positions[:, None] * theta)


def _keeps_norms(out, x, positions, base=10000.0):
    """A rotation keeps the length of every pair (k, k + d/2), hence of every row."""
    return (out.norm(dim=-1) - x.norm(dim=-1)).abs() <= 1e-9 * (1 + x.norm(dim=-1))


def check_rope(fn) -> None:
    r"""Check ``fn(x, positions, base=10000.0)``: RoPE in the half-split layout.

    Pair ``k`` is feature ``k`` with feature ``k + d/2`` (Hugging Face's
    ``rotate_half``), and row ``r`` of ``x`` is turned by the angle
    ``positions[r] * theta_k``, :math:`\theta_k = \text{base}^{-2k/d}`:

    .. math::

        (a, b) \mapsto (a \cos\alpha - b \sin\alpha,\; a \sin\alpha + b \cos\alpha)

    ``x`` is ``(..., n, d)`` float64 with ``d`` even, ``positions`` an int64 tensor
    ``(n,)``; ``fn`` returns the rotated ``x``, same shape and dtype. The inputs: one
    sequence; a batch of heads at scattered positions; a large base. Known mistakes are
    named: the interleaved layout (pairs ``(2k, 2k+1)``), the slowest frequency first,
    the rotation turned the wrong way, ``positions`` ignored, the exponent ``k/d``,
    float32 angles. Tolerance: 1e-10.

    Example:
        >>> def my_rope(x, positions, base=10000.0):
        ...     d = x.shape[-1]
        ...     theta = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        ...     angle = positions.double()[:, None] * theta
        ...     a, b = x[..., : d // 2], x[..., d // 2 :]
        ...     c, s = angle.cos(), angle.sin()
        ...     return torch.cat((a * c - b * s, a * s + b * c), -1)
        >>> check_rope(my_rope)  # doctest: +ELLIPSIS
        ✓ my_rope: RoPE, half-split pairs (k, k + d/2) (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _rope,
        [
            Case("5 rows of d = 8 at positions 0..4", (randn(5, 8), torch.arange(5))),
            Case(
                "(2, 3) heads of 4 rows, d = 6, positions 3, 0, 7, 100",
                (randn(2, 3, 4, 6, seed=1), torch.tensor([3, 0, 7, 100])),
            ),
            Case(
                "d = 16, positions 1000..1005, base 500000",
                (randn(6, 16, seed=2), torch.arange(1000, 1006)),
                {"base": 500000.0},
            ),
            Case("d = 2 (one pair)", (randn(3, 2, seed=3), torch.tensor([1, 2, 5]))),
        ],
        what="RoPE, half-split pairs (k, k + d/2)",
        properties=[Property("a rotation must keep every row's length", _keeps_norms)],
        mistakes=[
            Mistake(
                "this is the interleaved layout, pairs (2k, 2k+1): here pair k is "
                "feature k with feature k + d/2 (x[..., :d//2] and x[..., d//2:])",
                _rope_interleaved,
            ),
            Mistake(
                "the frequencies are in reverse order: pair 0 (features 0 and d/2) "
                "turns fastest, by 1 radian per position",
                _rope_slowest_first,
            ),
            Mistake(
                "the rotation turns the wrong way: (a, b) -> (a cos - b sin, "
                "a sin + b cos)",
                _rope_backwards,
            ),
            Mistake(
                "positions is ignored: row r turns by positions[r] * theta_k, not "
                "r * theta_k",
                _rope_positions_ignored,
            ),
            Mistake(
                "the exponent is k/d: theta_k = base^(-2k/d) "
                "(torch.arange(0, d, 2) / d)",
                _rope_exponent_k_over_d,
            ),
            Mistake(
                "the angles are float32: build the frequencies with "
                "torch.arange(0, d, 2, dtype=torch.float64)",
                _rope_float32_angles,
            ),
        ],
    )


# --------------------------------------------------------------------------- ALiBi


def _alibi(num_heads, n):
    return alibi_bias(num_heads, n, n, dtype=_F64)


def _distance(n):
    i = torch.arange(n, dtype=_F64)
    return (i[:, None] - i[None, :]).abs()  # (i, j)


def _slopes(num_heads, start=1):
    k = torch.arange(start, start + num_heads, dtype=_F64)
    return (2.0 ** (-8.0 * k / num_heads))[:, None, None]  # (h, 1, 1)


def _alibi_positive(num_heads, n):
    return _slopes(num_heads) * _distance(n)


def _alibi_slopes_from_zero(num_heads, n):
    return 0.0 - _slopes(num_heads, start=0) * _distance(n)


def _alibi_halving_slopes(num_heads, n):
    k = torch.arange(1, num_heads + 1, dtype=_F64)
    return 0.0 - (2.0**-k)[:, None, None] * _distance(n)


def _alibi_signed(num_heads, n):
    i = torch.arange(n, dtype=_F64)
    return 0.0 - _slopes(num_heads) * (i[:, None] - i[None, :])


def _alibi_bloom(num_heads, n):
    return _slopes(num_heads) * torch.arange(n, dtype=_F64).expand(n, n)  # m * j


def _zero_diagonal(out, num_heads, n):
    return out.diagonal(dim1=-2, dim2=-1) == 0


def check_alibi_bias(fn) -> None:
    r"""Check ``fn(num_heads, n)``: ALiBi's bias :math:`-m_h\,|i - j|` for every head.

    ``num_heads`` is a power of two; head ``h = 1 ... H`` has the slope
    :math:`m_h = 2^{-8h/H}` (for 8 heads: 1/2, 1/4, ..., 1/256). ``fn`` returns a
    float64 tensor ``(num_heads, n, n)`` (queries ``i``, keys ``j``), 0 on the diagonal
    and more negative with the distance. The inputs: 8 heads, 2 heads, 4 heads, 1 head.
    Known mistakes are named: the sign (a penalty is negative), the slopes counted from
    ``h = 0``, the slopes ``2^-h`` whatever the number of heads, a signed distance
    ``i - j``, BLOOM's ``m_h * j`` (the same softmax under a causal mask, not the same
    bias). Tolerance: 1e-10.

    Example:
        >>> def my_alibi_bias(num_heads, n):
        ...     h = torch.arange(1, num_heads + 1, dtype=torch.float64)
        ...     slopes = 2.0 ** (-8.0 * h / num_heads)
        ...     i = torch.arange(n, dtype=torch.float64)
        ...     return -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
        >>> check_alibi_bias(my_alibi_bias)  # doctest: +ELLIPSIS
        ✓ my_alibi_bias: ALiBi's bias -m_h |i - j| per head (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _alibi,
        [
            Case("8 heads, 5 positions", (8, 5)),
            Case("2 heads, 3 positions", (2, 3)),
            Case("4 heads, 6 positions", (4, 6)),
            Case("1 head, 4 positions", (1, 4)),
        ],
        what="ALiBi's bias -m_h |i - j| per head",
        properties=[Property("the diagonal (distance 0) must be 0", _zero_diagonal)],
        mistakes=[
            Mistake(
                "the bias has the wrong sign: ALiBi subtracts m_h |i - j|, so far "
                "keys score less",
                _alibi_positive,
            ),
            Mistake(
                "the slopes start at h = 0: head h = 1 ... H has 2^(-8h/H), so the "
                "first slope is 2^(-8/H), not 1",
                _alibi_slopes_from_zero,
            ),
            Mistake(
                "the slopes ignore the number of heads: m_h = 2^(-8h/H), which is "
                "2^-h only for H = 8",
                _alibi_halving_slopes,
            ),
            Mistake(
                "the distance is signed: use |i - j|, so keys on both sides are "
                "penalised",
                _alibi_signed,
            ),
            Mistake(
                "this is BLOOM's m_h * j: under a causal mask it gives the same "
                "softmax (it differs by m_h * i, a constant per row), but the bias "
                "asked for is -m_h |i - j|",
                _alibi_bloom,
            ),
        ],
    )


# --------------------------------------------------------------------------- Llama 3.1


def _llama3(d, base, factor, low_freq_factor, high_freq_factor, original):
    scaling = {
        "type": "llama3",
        "factor": factor,
        "low_freq_factor": low_freq_factor,
        "high_freq_factor": high_freq_factor,
        "original_max_position_embeddings": original,
    }
    return rope_frequencies(d, base=base, scaling=scaling)


def _blend(theta, factor, gamma):
    return (1 - gamma) * theta / factor + gamma * theta


def _llama3_bands_swapped(d, base, factor, low, high, original):
    theta = _frequencies(d, base)
    turns = original * theta / (2 * math.pi)
    gamma = ((turns - low) / (high - low)).clamp(0, 1)
    return _blend(theta, factor, 1 - gamma)  # divides the fast pairs


def _llama3_without_two_pi(d, base, factor, low, high, original):
    theta = _frequencies(d, base)
    turns = original * theta  # wavelength taken as 1 / theta
    gamma = ((turns - low) / (high - low)).clamp(0, 1)
    return _blend(theta, factor, gamma)


def _llama3_no_blend(d, base, factor, low, high, original):
    theta = _frequencies(d, base)
    turns = original * theta / (2 * math.pi)
    return torch.where(turns < high, theta / factor, theta)


def _llama3_all_divided(d, base, factor, low, high, original):
    return _frequencies(d, base) / factor


def _llama3_gamma_in_wavelength(d, base, factor, low, high, original):
    theta = _frequencies(d, base)
    wavelength = 2 * math.pi / theta
    gamma = ((original / low - wavelength) / (original / low - original / high)).clamp(
        0, 1
    )
    return _blend(theta, factor, gamma)


def _between_theta_and_theta_over_factor(out, d, base, factor, *_):
    theta = _frequencies(d, base)
    return (out <= theta * (1 + 1e-12)) & (out >= theta / factor * (1 - 1e-12))


def check_llama3_frequencies(fn) -> None:
    r"""Check ``fn(d, base, factor, low_freq_factor, high_freq_factor, original)``:
    Llama 3.1's RoPE frequencies.

    Start from :math:`\theta_k = \text{base}^{-2k/d}` and count the turns pair ``k``
    makes in the ``original`` training context, :math:`t_k = \text{original}\cdot
    \theta_k / 2\pi`. Pairs with :math:`t_k \ge` ``high_freq_factor`` are kept, pairs
    with :math:`t_k \le` ``low_freq_factor`` are divided by ``factor``, and in between

    .. math:: \theta_k \Big(\frac{1 - \gamma}{\text{factor}} + \gamma\Big), \qquad
        \gamma = \frac{t_k - \text{low\_freq\_factor}}
        {\text{high\_freq\_factor} - \text{low\_freq\_factor}}

    ``fn`` returns the ``(d/2,)`` float64 frequencies. The inputs: Llama 3.1's own
    (``d = 128``, base 500000, factor 8, bands 1 and 4, 8192 positions), the chapter's
    tiny model, and wider bands. Known mistakes are named: the bands swapped (the fast
    pairs divided), the wavelength taken as ``1/theta`` (no ``2 pi``), no blend (a hard
    step), every pair divided (that is position interpolation), the blend made linear
    in the wavelength. Tolerance: 1e-10.

    Example:
        >>> import math
        >>> def my_llama3(d, base, factor, low, high, original):
        ...     theta = base ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
        ...     turns = original * theta / (2 * math.pi)
        ...     gamma = ((turns - low) / (high - low)).clamp(0, 1)
        ...     return (1 - gamma) * theta / factor + gamma * theta
        >>> check_llama3_frequencies(my_llama3)  # doctest: +ELLIPSIS
        ✓ my_llama3: Llama 3.1's scaling, three bands (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _llama3,
        [
            Case(
                "Llama 3.1: d = 128, base 500000", (128, 500000.0, 8.0, 1.0, 4.0, 8192)
            ),
            Case(
                "the chapter's model: d = 16, 32 positions",
                (16, 10000.0, 8.0, 1.0, 4.0, 32),
            ),
            Case("bands 2 and 16, factor 3", (64, 10000.0, 3.0, 2.0, 16.0, 512)),
        ],
        what="Llama 3.1's scaling, three bands",
        properties=[
            Property(
                "every frequency must lie between theta_k / factor and theta_k",
                _between_theta_and_theta_over_factor,
            )
        ],
        mistakes=[
            Mistake(
                "the bands are swapped: pairs that turn many times in the original "
                "context (the fast ones) are kept, the slow ones divided by factor",
                _llama3_bands_swapped,
            ),
            Mistake(
                "the turns lack 2 pi: a pair's wavelength is 2 pi / theta_k, so it "
                "turns original * theta_k / (2 pi) times",
                _llama3_without_two_pi,
            ),
            Mistake(
                "there is no blend between the bands: between low_freq_factor and "
                "high_freq_factor turns, mix theta / factor and theta with gamma",
                _llama3_no_blend,
            ),
            Mistake(
                "every pair is divided by factor: that is position interpolation; "
                "Llama 3.1 keeps the fast pairs",
                _llama3_all_divided,
            ),
            Mistake(
                "the blend is linear in the wavelength: gamma is linear in the turns, "
                "(t_k - low) / (high - low)",
                _llama3_gamma_in_wavelength,
            ),
        ],
    )
