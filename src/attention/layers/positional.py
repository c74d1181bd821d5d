"""Position information for attention: sinusoidal, rotary, linear-bias and bucketed (chapter 7).

Self-attention without position information is permutation-equivariant: shuffle the
tokens and the outputs are shuffled the same way. Every function here injects order in
one of the ways the chapter compares:

* :func:`sinusoidal_positions`: the absolute encoding added to the token embeddings
  (Vaswani et al., 2017).
* :func:`rope_frequencies` and :func:`apply_rope`: rotary position embedding (RoPE; Su
  et al., 2021), a rotation of each query/key feature pair by an angle proportional to the
  position, so that a query-key score depends only on the distance between the two
  positions. Both feature layouts are supported: pairs ``(k, k + d/2)`` as in Hugging
  Face's Llama (``interleaved=False``) and pairs ``(2k, 2k+1)`` as in RoFormer and Meta's
  complex-number form (``interleaved=True``). The ``scaling`` dict stretches the
  frequencies at inference (position interpolation, NTK-aware scaling).
* :func:`alibi_slopes` and :func:`alibi_bias`: ALiBi (Press et al., 2022), a per-head
  penalty proportional to the distance, passed to attention as a float mask.
* :func:`relative_position_bucket`: T5's map from a distance to one of a few learned
  biases (Raffel et al., 2020).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``n`` sequence length when ``i = j``, ``d`` feature size.

Mask convention: a bias from :func:`alibi_bias` is a float mask, *added* to the scores;
boolean masks elsewhere in the package mean **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.

Angles are computed in float64 whatever the input's dtype: at position 100 000 a float32
angle is already wrong in its third decimal.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_bool, check_device, check_int, check_tensor
from .._rope import (  # noqa: F401  (kept importable here)
    RotaryConfig,
    check_base,
    check_feature_size,
    check_float_dtype,
    check_positions,
    check_scaling,
    inv_freq,
    rope_rotate,
    rotate,
)

__all__ = [
    "sinusoidal_positions",
    "rope_frequencies",
    "apply_rope",
    "RotaryConfig",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
]

# defined next to the rotation it configures (no import cycle), documented here
RotaryConfig.__module__ = __name__


def _slopes_power_of_two(h: int) -> list[float]:
    return [2.0 ** (-8.0 * (k + 1) / h) for k in range(h)]


# ------------------------------------------------------------------ public functions


def sinusoidal_positions(
    n: int,
    d: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype | None = None,
    device=None,
) -> Tensor:
    r"""The sinusoidal position encodings of the Transformer, one row per position.

    .. math::
        PE_{p, 2k} = \sin(p\,\theta_k), \qquad PE_{p, 2k+1} = \cos(p\,\theta_k), \qquad
        \theta_k = \text{base}^{-2k/d}

    Each pair of columns is a point on a circle turning at its own frequency, so
    ``PE[p + m]`` is a fixed rotation of ``PE[p]`` (the same for every ``p``).

    Args:
        n: number of positions ``0 ... n - 1`` (>= 0).
        d: feature size, even.
        base: the wavelength scale; wavelengths run from ``2*pi`` to ``2*pi*base``.
        dtype: floating dtype of the result (default: torch's default dtype). The angles
            are computed in float64 and rounded once.
        device: where to create the result.

    Returns:
        ``(n, d)`` encodings, to be added to the token embeddings.

    Example:
        >>> pe = sinusoidal_positions(3, 4, dtype=torch.float64)
        >>> pe[0].tolist()  # position 0: sin 0 = 0, cos 0 = 1
        [0.0, 1.0, 0.0, 1.0]
        >>> round(pe[1, 0].item(), 4), round(pe[1, 2].item(), 4)  # sin(1), sin(1/100)
        (0.8415, 0.01)
    """
    n = check_int("n", n, minimum=0)
    d = check_feature_size(d)
    base = check_base(base)
    dtype = check_float_dtype(dtype)
    device = check_device("device", device)
    angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv_freq(
        d, base, None, device
    )  # (n, d/2)
    return (
        torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(n, d).to(dtype)
    )  # (n, d)


def rope_frequencies(
    d: int, *, base: float = 10000.0, scaling: dict | None = None
) -> Tensor:
    r"""The inverse frequencies :math:`\theta_k = \text{base}^{-2k/d}` of rotary embeddings.

    Feature pair ``k`` of a query or key at position ``p`` is rotated by the angle
    :math:`p\,\theta_k`. ``scaling`` changes the frequencies so that a model trained on
    length ``L`` can read positions up to about ``factor * L``:

    * ``{"type": "linear", "factor": s}``: position interpolation (Chen et al., 2023),
      :math:`\theta_k / s`, as if every position were divided by ``s``;
    * ``{"type": "ntk", "factor": s}``: static NTK-aware scaling, a larger base,
      :math:`(\text{base} \cdot s^{d/(d-2)})^{-2k/d}`: the fastest pair is unchanged and
      the slowest is divided by ``s``.

    ``"rope_type"`` is accepted as an alias of ``"type"``, as in Hugging Face configs.

    Args:
        d: head size, even.
        base: :math:`\theta_0 / \theta_{d/2-1}` spans about ``base``.
        scaling: None or a dict as above.

    Returns:
        ``(d/2,)`` float64 frequencies (float64 because ``p * theta`` at large ``p`` needs
        the precision; cast where needed).

    Example:
        >>> rope_frequencies(4).tolist()  # 10000^0, 10000^(-1/2)
        [1.0, 0.01]
        >>> rope_frequencies(4, scaling={"type": "linear", "factor": 2.0}).tolist()
        [0.5, 0.005]
    """
    d = check_feature_size(d)
    base = check_base(base)
    return inv_freq(d, base, check_scaling(scaling, d))


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    scaling: dict | None = None,
) -> Tensor:
    r"""Rotary position embedding: rotate each feature pair of ``x`` by ``position * theta_k``.

    .. math::
        \begin{pmatrix} y_a \\ y_b \end{pmatrix} =
        \begin{pmatrix} \cos p\theta_k & -\sin p\theta_k \\ \sin p\theta_k & \cos p\theta_k
        \end{pmatrix}
        \begin{pmatrix} x_a \\ x_b \end{pmatrix}

    Apply it to the queries and the keys (not the values); then
    :math:`\langle R_m q, R_n k \rangle = \langle q, R_{n-m} k \rangle` depends on the
    positions only through ``n - m``.

    Args:
        x: ``(..., n, d)`` queries or keys, ``d`` even (e.g. ``(b, h, n, d)`` per head).
        positions: integer positions of the ``n`` rows: ``(n,)`` or any shape that
            broadcasts to ``(..., n)``; default ``arange(n)``. During cached decoding pass
            the positions of the new tokens.
        base: see :func:`rope_frequencies`.
        interleaved: False pairs feature ``k`` with ``k + d/2`` (Hugging Face's
            ``rotate_half``, used by Llama checkpoints there); True pairs ``2k`` with
            ``2k+1`` (RoFormer, Meta's complex-number code). The two differ by a fixed
            permutation of the features.
        scaling: None, ``{"type": "linear", "factor": s}`` or ``{"type": "ntk", "factor": s}``;
            see :func:`rope_frequencies`.

    Returns:
        The rotated ``x``: same shape and dtype. The angles are computed in float64; their
        cosines and sines are rounded to ``x``'s dtype.

    Example:
        >>> x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)  # one feature pair
        >>> apply_rope(x, torch.tensor([1])).tolist() == [[math.cos(1.0), math.sin(1.0)]]
        True
    """
    return rotate(x, positions, base, interleaved, scaling)


def alibi_slopes(num_heads: int) -> Tensor:
    r"""The per-head slopes of ALiBi: a geometric sequence, one slope per head.

    For ``h`` a power of two, :math:`m_k = 2^{-8k/h}` for ``k = 1 ... h`` (for 8 heads:
    1/2, 1/4, ..., 1/256). Otherwise, as in the paper, the ``2^floor(log2 h)`` slopes of the
    largest power of two below ``h`` come first, followed by every other slope of the
    sequence for twice that power until there are ``h``.

    Args:
        num_heads: ``h`` >= 1.

    Returns:
        ``(h,)`` float64 slopes, decreasing within each of the two runs.

    Example:
        >>> alibi_slopes(4).tolist()
        [0.25, 0.0625, 0.015625, 0.00390625]
    """
    h = check_int("num_heads", num_heads, minimum=1)
    power = 2 ** int(math.floor(math.log2(h)))
    slopes = _slopes_power_of_two(power)
    if power < h:
        slopes += _slopes_power_of_two(2 * power)[0::2][: h - power]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(
    num_heads: int, i: int, j: int, *, dtype: torch.dtype | None = None, device=None
) -> Tensor:
    r"""ALiBi's additive attention bias :math:`-m_h \, |q - k|` for every head.

    The ``i`` queries sit at the last ``i`` of the ``j`` key positions (``q = j - i + r``
    for row ``r``), as in decoding with a cache; ``i = j`` is the square case. Add it to the
    scores, i.e. pass it as a float ``attn_mask`` (combine it with a causal mask for a
    decoder: boolean masks mean True = may attend, float masks are added).

    Args:
        num_heads: ``h``, one slope per head (:func:`alibi_slopes`).
        i: query positions, ``0 <= i <= j``.
        j: key positions.
        dtype: floating dtype of the result (default: torch's default dtype).
        device: where to create the result.

    Returns:
        ``(h, i, j)`` bias, 0 on the diagonal and more negative with the distance.

    Example:
        >>> alibi_bias(1, 1, 3, dtype=torch.float64).tolist()  # one query at position 2
        [[[-0.0078125, -0.00390625, 0.0]]]
    """
    h = check_int("num_heads", num_heads, minimum=1)
    i = check_int("i", i, minimum=0)
    j = check_int("j", j, minimum=0)
    if i > j:
        raise ValueError(
            f"the i queries are the last i of the j key positions, so i <= j is needed, "
            f"got i={i} and j={j}"
        )
    dtype = check_float_dtype(dtype)
    device = check_device("device", device)
    q = torch.arange(j - i, j, device=device)[:, None]  # (i, 1)
    k = torch.arange(j, device=device)[None, :]  # (1, j)
    distance = (q - k).abs().to(torch.float64)  # (i, j)
    slopes = alibi_slopes(h).to(device)[:, None, None]  # (h, 1, 1)
    return (0.0 - slopes * distance).to(
        dtype
    )  # (h, i, j); 0 - 0 = +0.0 on the diagonal


def relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    r"""T5's bucket for a relative position (key position minus query position).

    Small distances get a bucket each; larger ones share logarithmically wider buckets up
    to ``max_distance``, beyond which all distances share the last bucket. Each bucket
    owns one learned bias per head, added to the scores. With ``bidirectional=True`` half
    the buckets are for keys after the query; with False, keys after the query (positive
    relative positions) all fall in bucket 0.

    With :math:`B` buckets per direction and :math:`E = B/2` exact ones, a distance
    :math:`r \ge E` goes to bucket
    :math:`\min\!\big(B - 1,\; E + \lfloor \ln(r/E) / \ln(\text{max\_distance}/E) \cdot (B - E) \rfloor\big)`.

    Args:
        relative_position: integer tensor of any shape, ``key - query``.
        bidirectional: whether keys may follow the query (encoder) or not (decoder).
        num_buckets: buckets in all; per direction ``num_buckets // 2`` if bidirectional.
        max_distance: distances from here on share the last bucket; must exceed the
            number of exact buckets.

    Returns:
        int64 buckets in ``[0, num_buckets)``, the shape of ``relative_position``.

    Example:
        >>> relative_position_bucket(torch.tensor([-3, -1, 0, 1, 3, 200])).tolist()
        [3, 1, 0, 17, 19, 31]
    """
    check_tensor("relative_position", relative_position)
    rel = relative_position
    if rel.is_floating_point() or rel.is_complex() or rel.dtype == torch.bool:
        raise TypeError(f"relative_position must be an integer tensor, got {rel.dtype}")
    check_bool("bidirectional", bidirectional)
    num_buckets = check_int("num_buckets", num_buckets, minimum=1)
    max_distance = check_int("max_distance", max_distance, minimum=1)
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    if exact < 1:
        raise ValueError(
            f"num_buckets must leave at least 2 buckets per direction, got {num_buckets} "
            f"(bidirectional={bidirectional})"
        )
    if max_distance <= exact:
        raise ValueError(
            f"max_distance must exceed the {exact} exact buckets, got max_distance={max_distance}"
        )

    rel = rel.to(torch.int64)
    if bidirectional:
        offset = (rel > 0).to(
            torch.int64
        ) * per_side  # keys after the query: upper half
        distance = rel.abs()
    else:
        offset = torch.zeros_like(rel)
        distance = (-rel).clamp(min=0)  # keys after the query count as distance 0
    # float64 logarithms: the same buckets as T5's float32 code, with room to spare at the
    # bucket edges (distances E * (max_distance / E)^(t / (B - E)) that are integers)
    ratio = distance.clamp(min=exact).to(torch.float64) / exact
    log_bucket = (ratio.log() / math.log(max_distance / exact) * (per_side - exact)).to(
        torch.int64
    )
    large = (exact + log_bucket).clamp(max=per_side - 1)
    return offset + torch.where(distance < exact, distance, large)
