"""Chapter 7's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch07
from exercise_rows import Row

F64 = torch.float64


def my_sinusoidal(n, d, base=10000.0):
    """Sinusoidal position encodings (n, d): sin and cos of p * theta_k, interleaved."""
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angles = torch.arange(n, dtype=F64)[:, None] * theta
    pe = torch.empty(n, d, dtype=F64)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


def my_sinusoidal_stub(n, d, base=10000.0):
    """Sinusoidal position encodings (n, d): sin and cos of p * theta_k, interleaved."""
    raise NotImplementedError("write your solution here")


def sinusoidal_with_cos_first(n, d, base=10000.0):
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angles = torch.arange(n, dtype=F64)[:, None] * theta
    pe = torch.empty(n, d, dtype=F64)
    pe[:, 0::2], pe[:, 1::2] = angles.cos(), angles.sin()
    return pe


def sinusoidal_in_two_blocks(n, d, base=10000.0):
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angles = torch.arange(n, dtype=F64)[:, None] * theta
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def sinusoidal_with_exponent_k_over_d(n, d, base=10000.0):
    theta = 1 / base ** (torch.arange(d // 2, dtype=F64) / d)
    angles = torch.arange(n, dtype=F64)[:, None] * theta
    pe = torch.empty(n, d, dtype=F64)
    pe[:, 0::2], pe[:, 1::2] = angles.sin(), angles.cos()
    return pe


def sinusoidal_in_float32(n, d, base=10000.0):
    theta = base ** -(torch.arange(0, d, 2) / d)
    angles = torch.arange(n)[:, None] * theta
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(n, d)


def my_rope(x, positions, base=10000.0):
    """Rotate pair (k, k + d/2) of row r by positions[r] * theta_k (half-split RoPE)."""
    d = x.shape[-1]
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angle = positions.to(F64)[:, None] * theta  # (n, d/2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    cos, sin = angle.cos(), angle.sin()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def my_rope_stub(x, positions, base=10000.0):
    """Rotate pair (k, k + d/2) of row r by positions[r] * theta_k (half-split RoPE)."""
    raise NotImplementedError("write your solution here")


def rope_interleaved(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angle = positions.to(F64)[:, None] * theta
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = angle.cos(), angle.sin()
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
    return out


def rope_with_reversed_frequencies(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** -(torch.arange(d - 2, -1, -2, dtype=F64) / d)  # slowest first
    angle = positions.to(F64)[:, None] * theta
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat(
        [a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1
    )


def rope_turning_backwards(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    angle = positions.to(F64)[:, None] * theta
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat(
        [a * angle.cos() + b * angle.sin(), -a * angle.sin() + b * angle.cos()], -1
    )


def rope_ignoring_positions(x, positions, base=10000.0):
    return my_rope(x, torch.arange(x.shape[-2]), base)


def my_alibi_bias(num_heads, n):
    """ALiBi's bias -m_h |i - j| for every head, (num_heads, n, n)."""
    h = torch.arange(1, num_heads + 1, dtype=F64)
    slopes = 2.0 ** (-8.0 * h / num_heads)  # (H,)
    i = torch.arange(n, dtype=F64)
    distance = (i[:, None] - i[None, :]).abs()  # (n, n)
    return -slopes[:, None, None] * distance


def my_alibi_bias_stub(num_heads, n):
    """ALiBi's bias -m_h |i - j| for every head, (num_heads, n, n)."""
    raise NotImplementedError("write your solution here")


def alibi_as_a_bonus(num_heads, n):
    return -my_alibi_bias(num_heads, n)


def alibi_with_slopes_from_zero(num_heads, n):
    h = torch.arange(num_heads, dtype=F64)
    i = torch.arange(n, dtype=F64)
    return -(2.0 ** (-8.0 * h / num_heads))[:, None, None] * (i[:, None] - i).abs()


def alibi_with_halving_slopes(num_heads, n):
    h = torch.arange(1, num_heads + 1, dtype=F64)
    i = torch.arange(n, dtype=F64)
    return -(0.5**h)[:, None, None] * (i[:, None] - i).abs()


def alibi_as_bloom_writes_it(num_heads, n):
    h = torch.arange(1, num_heads + 1, dtype=F64)
    slopes = 2.0 ** (-8.0 * h / num_heads)
    return slopes[:, None, None] * torch.arange(n, dtype=F64).expand(n, n)


def my_llama3_frequencies(d, base, factor, low_freq_factor, high_freq_factor, original):
    """Llama 3.1's RoPE frequencies: fast pairs kept, slow ones divided, a blend."""
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    turns = original * theta / (2 * math.pi)  # turns in the original context
    gamma = ((turns - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(
        0, 1
    )
    return (1 - gamma) * theta / factor + gamma * theta


def my_llama3_frequencies_stub(
    d, base, factor, low_freq_factor, high_freq_factor, original
):
    """Llama 3.1's RoPE frequencies: fast pairs kept, slow ones divided, a blend."""
    raise NotImplementedError("write your solution here")


def llama3_dividing_the_fast_pairs(d, base, factor, low, high, original):
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    turns = original * theta / (2 * math.pi)
    gamma = ((turns - low) / (high - low)).clamp(0, 1)
    return gamma * theta / factor + (1 - gamma) * theta


def llama3_without_the_blend(d, base, factor, low, high, original):
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    wavelength = 2 * math.pi / theta
    return torch.where(wavelength > original / high, theta / factor, theta)


def llama3_with_wavelength_one_over_theta(d, base, factor, low, high, original):
    theta = base ** -(torch.arange(0, d, 2, dtype=F64) / d)
    wavelength = 1 / theta
    gamma = ((original / wavelength - low) / (high - low)).clamp(0, 1)
    return (1 - gamma) * theta / factor + gamma * theta


def llama3_as_interpolation(d, base, factor, low, high, original):
    return base ** -(torch.arange(0, d, 2, dtype=F64) / d) / factor


ROWS = [
    Row(
        ch07.check_sinusoidal,
        my_sinusoidal,
        my_sinusoidal_stub,
        (
            (sinusoidal_with_cos_first, "sine and cosine are swapped"),
            (sinusoidal_in_two_blocks, "one block and the cosines as another"),
            (sinusoidal_with_exponent_k_over_d, "the exponent is k/d"),
            (sinusoidal_in_float32, "the result is float32"),
        ),
    ),
    Row(
        ch07.check_rope,
        my_rope,
        my_rope_stub,
        (
            (rope_interleaved, "this is the interleaved layout"),
            (rope_with_reversed_frequencies, "frequencies are in reverse order"),
            (rope_turning_backwards, "turns the wrong way"),
            (rope_ignoring_positions, "positions is ignored"),
        ),
    ),
    Row(
        ch07.check_alibi_bias,
        my_alibi_bias,
        my_alibi_bias_stub,
        (
            (alibi_as_a_bonus, "the wrong sign"),
            (alibi_with_slopes_from_zero, "the slopes start at h = 0"),
            (alibi_with_halving_slopes, "ignore the number of heads"),
            (alibi_as_bloom_writes_it, "this is BLOOM's m_h * j"),
        ),
    ),
    Row(
        ch07.check_llama3_frequencies,
        my_llama3_frequencies,
        my_llama3_frequencies_stub,
        (
            (llama3_dividing_the_fast_pairs, "the bands are swapped"),
            (llama3_without_the_blend, "there is no blend"),
            (llama3_with_wavelength_one_over_theta, "the turns lack 2 pi"),
            (llama3_as_interpolation, "every pair is divided by factor"),
        ),
    ),
]
