"""Position information for attention (chapter 7).

Four kinds: sinusoidal, rotary, linear-bias and bucketed.

Self-attention without position information is permutation-equivariant: shuffle the
tokens and the outputs are shuffled the same way. Every function here injects order in
one of the ways the chapter compares:

* :func:`sinusoidal_positions`: the absolute encoding added to the token embeddings
  (Vaswani et al., 2017).
* :func:`rope_frequencies` and :func:`apply_rope`: rotary position embedding (RoPE; Su
  et al., 2021), a rotation of each query/key feature pair by an angle proportional to
  the position, so that a query-key score depends only on the distance between the two
  positions. Both feature layouts are supported: pairs ``(k, k + d/2)`` as in Hugging
  Face's Llama (``interleaved=False``) and pairs ``(2k, 2k+1)`` as in RoFormer and
  Meta's complex-number form (``interleaved=True``). The ``scaling`` dict stretches the
  frequencies at inference (position interpolation, NTK-aware scaling, Llama 3.1's
  scaling and YaRN, with YaRN's attention factor).
* :func:`alibi_slopes` and :func:`alibi_bias`: ALiBi (Press et al., 2022), a per-head
  penalty proportional to the distance, passed to attention as a float mask.
* :func:`relative_position_bucket`: T5's map from a distance to one of a few learned
  biases (Raffel et al., 2020).
* :func:`nope_temperature` and :func:`temperature_tuned_attention`: no position at all
  (NoPE) in some layers, as in Llama 4 and SmolLM3, with Llama 4's attention
  temperature: the queries of a NoPE layer are multiplied by a factor that grows with
  the logarithm of their position.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``n`` sequence length when ``i = j``, ``d`` feature
size.

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

from .._checks import (
    check_bool,
    check_device,
    check_int,
    check_real,
    check_tensor,
    validate_attention,
)
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
from ..foundations.scaled_dot_product import scaled_dot_product_attention

__all__ = [
    "sinusoidal_positions",
    "rope_frequencies",
    "apply_rope",
    "RotaryConfig",
    "alibi_slopes",
    "alibi_bias",
    "relative_position_bucket",
    "nope_temperature",
    "temperature_tuned_attention",
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
    r"""The inverse frequencies :math:`\theta_k = \text{base}^{-2k/d}` of RoPE.

    Feature pair ``k`` of a query or key at position ``p`` is rotated by the angle
    :math:`p\,\theta_k`. ``scaling`` changes the frequencies so that a model trained on
    length ``L`` can read positions up to about ``factor * L``:

    * ``{"type": "linear", "factor": s}``: position interpolation (Chen et al., 2023),
      :math:`\theta_k / s`, as if every position were divided by ``s``;
    * ``{"type": "ntk", "factor": s}``: static NTK-aware scaling, a larger base,
      :math:`(\text{base} \cdot s^{d/(d-2)})^{-2k/d}`: the fastest pair is unchanged and
      the slowest is divided by ``s``;
    * ``{"type": "llama3", "factor": s, "low_freq_factor": a, "high_freq_factor": b,
      "original_max_position_embeddings": L}`` (Llama 3.1: ``s = 8, a = 1, b = 4,
      L = 8192``): with :math:`t_k = L\,\theta_k / 2\pi` the turns pair ``k`` makes in
      ``L`` positions, pairs with :math:`t_k \ge b` are kept, pairs with
      :math:`t_k \le a` divided by ``s``, and in between
      :math:`\theta_k \big((1 - \gamma)/s + \gamma\big)` with
      :math:`\gamma = (t_k - a)/(b - a)`;
    * ``{"type": "yarn", "factor": s, "original_max_position_embeddings": L}`` with the
      optional ``beta_fast`` (32), ``beta_slow`` (1), ``attention_factor`` and
      ``truncate`` (True): YaRN's "NTK-by-parts" (Peng et al., 2024). Pairs turning
      more than ``beta_fast`` times in ``L`` positions are kept, pairs turning fewer
      than ``beta_slow`` times are divided by ``s``, and a linear ramp in the pair index
      joins them (its ends rounded outwards to whole pairs when ``truncate``). YaRN also
      multiplies cos and sin by an attention factor, ``0.1 ln s + 1`` unless given
      (:attr:`RotaryConfig.attention_factor`); :func:`apply_rope` applies it.

    The llama3 and yarn rules, names and defaults are those of transformers'
    ``ROPE_INIT_FUNCTIONS`` (``rope_parameters`` without ``rope_theta``: the base is
    ``base``). ``"rope_type"`` is accepted as an alias of ``"type"``.

    Args:
        d: head size, even.
        base: :math:`\theta_0 / \theta_{d/2-1}` spans about ``base`` (> 1 for yarn).
        scaling: None or a dict as above.

    Returns:
        ``(d/2,)`` float64 frequencies (float64 because ``p * theta`` at large ``p``
        needs the precision; cast where needed).

    Example:
        >>> rope_frequencies(4).tolist()  # 10000^0, 10000^(-1/2)
        [1.0, 0.01]
        >>> rope_frequencies(4, scaling={"type": "linear", "factor": 2.0}).tolist()
        [0.5, 0.005]
        >>> llama31 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        ...            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        >>> (rope_frequencies(4) / rope_frequencies(4, scaling=llama31)).tolist()
        [1.0, 8.0]
    """
    d = check_feature_size(d)
    base = check_base(base)
    checked = check_scaling(scaling, d, base)  # the dict as a normalised tuple
    return inv_freq(d, base, checked)


def apply_rope(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    scaling: dict | None = None,
) -> Tensor:
    r"""Rotary position embedding: rotate each feature pair ``k`` by ``p * theta_k``.

    ``p`` is the position of the row of ``x``:

    .. math::
        \begin{pmatrix} y_a \\ y_b \end{pmatrix} =
        \begin{pmatrix} \cos p\theta_k & -\sin p\theta_k \\
                        \sin p\theta_k & \cos p\theta_k \end{pmatrix}
        \begin{pmatrix} x_a \\ x_b \end{pmatrix}

    Apply it to the queries and the keys (not the values); then
    :math:`\langle R_m q, R_n k \rangle = \langle q, R_{n-m} k \rangle` depends on the
    positions only through ``n - m``.

    Args:
        x: ``(..., n, d)`` queries or keys, ``d`` even (e.g. ``(b, h, n, d)`` per head).
        positions: integer positions of the ``n`` rows: ``(n,)`` or any shape that
            broadcasts to ``(..., n)``; default ``arange(n)``. During cached decoding
            pass the positions of the new tokens.
        base: see :func:`rope_frequencies`.
        interleaved: False pairs feature ``k`` with ``k + d/2`` (Hugging Face's
            ``rotate_half``, used by Llama checkpoints there); True pairs ``2k`` with
            ``2k+1`` (RoFormer, Meta's complex-number code). The two differ by a fixed
            permutation of the features.
        scaling: None or a dict of type ``"linear"``, ``"ntk"``, ``"llama3"`` or
            ``"yarn"``; see :func:`rope_frequencies`. Under ``"yarn"`` the cosines and
            sines are multiplied by its attention factor (as in transformers), so the
            result is a rotation times that factor and ``q . k`` grows by its square.

    Returns:
        The rotated ``x``: same shape and dtype. The angles are computed in float64;
        their cosines and sines are rounded to ``x``'s dtype.

    Example:
        >>> x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)  # one feature pair
        >>> y = apply_rope(x, torch.tensor([1]))
        >>> y.tolist() == [[math.cos(1.0), math.sin(1.0)]]
        True
    """
    return rotate(x, positions, base, interleaved, scaling)


def alibi_slopes(num_heads: int) -> Tensor:
    r"""The per-head slopes of ALiBi: a geometric sequence, one slope per head.

    For ``h`` a power of two, :math:`m_k = 2^{-8k/h}` for ``k = 1 ... h`` (for 8 heads:
    1/2, 1/4, ..., 1/256). Otherwise, as in the paper, the ``2^floor(log2 h)`` slopes of
    the largest power of two below ``h`` come first, followed by every other slope of
    the sequence for twice that power until there are ``h``.

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

    The ``i`` queries sit at the last ``i`` of the ``j`` key positions
    (``q = j - i + r`` for row ``r``), as in decoding with a cache; ``i = j`` is the
    square case. Add it to the scores, i.e. pass it as a float ``attn_mask`` (combine it
    with a causal mask for a decoder: boolean masks mean True = may attend, float masks
    are added).

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
            "the i queries are the last i of the j key positions, so i <= j is "
            f"needed, got i={i} and j={j}"
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

    Small distances get a bucket each; larger ones share logarithmically wider buckets
    up to ``max_distance``, beyond which all distances share the last bucket. Each
    bucket owns one learned bias per head, added to the scores. With
    ``bidirectional=True`` half the buckets are for keys after the query; with False,
    keys after the query (positive relative positions) all fall in bucket 0.

    With :math:`B` buckets per direction and :math:`E = B/2` exact ones, a distance
    :math:`r \ge E` goes to bucket

    .. math::

        \min\!\big(B - 1,\;
        E + \lfloor \ln(r/E) / \ln(\text{max\_distance}/E) \cdot (B - E) \rfloor\big).

    Args:
        relative_position: integer tensor of any shape, ``key - query``.
        bidirectional: whether keys may follow the query (encoder) or not (decoder).
        num_buckets: buckets in all; per direction ``num_buckets // 2`` if
            bidirectional.
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
            "num_buckets must leave at least 2 buckets per direction, got "
            f"{num_buckets} (bidirectional={bidirectional})"
        )
    if max_distance <= exact:
        raise ValueError(
            f"max_distance must exceed the {exact} exact buckets, got "
            f"max_distance={max_distance}"
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
    # float64 logarithms: the same buckets as T5's float32 code, with room to spare at
    # the bucket edges (distances E * (max_distance / E)^(t / (B - E)) that are
    # integers)
    ratio = distance.clamp(min=exact).to(torch.float64) / exact
    log_bucket = (ratio.log() / math.log(max_distance / exact) * (per_side - exact)).to(
        torch.int64
    )
    large = (exact + log_bucket).clamp(max=per_side - 1)
    return offset + torch.where(distance < exact, distance, large)


def _check_temperature_options(floor_scale, attn_scale) -> tuple[int, float]:
    floor_scale = check_int("floor_scale", floor_scale, minimum=1)
    attn_scale = check_real("attn_scale", attn_scale)
    if not math.isfinite(attn_scale):
        raise ValueError(f"attn_scale must be finite, got {attn_scale}")
    return floor_scale, attn_scale


def _temperature(positions: Tensor, floor_scale: int, attn_scale: float) -> Tensor:
    """Unchecked core of :func:`nope_temperature` (positions >= 0, integers)."""
    steps = torch.div(positions + 1, floor_scale, rounding_mode="floor")  # exact ints
    return 1.0 + attn_scale * torch.log1p(steps.to(torch.float64))


def nope_temperature(
    positions: Tensor, *, floor_scale: int = 8192, attn_scale: float = 0.1
) -> Tensor:
    r"""Llama 4's attention temperature: the factor on the query at each position.

    .. math::
        \tau_p = 1 + \text{attn\_scale} \cdot
        \ln\!\Big(1 + \Big\lfloor \frac{p + 1}{\text{floor\_scale}} \Big\rfloor\Big)

    Llama 4 leaves out RoPE in every fourth layer (a NoPE layer) and multiplies the
    queries of those layers by :math:`\tau_p` (Hugging Face's
    ``Llama4TextAttention``, ``attn_temperature_tuning``). Every score of the query at
    position ``p`` is multiplied by :math:`\tau_p`: the softmax sharpens as the number
    of visible keys grows, like the log-n scaling of chapter 3, but in steps of
    ``floor_scale`` positions (1 for the first ``floor_scale - 1``).

    Args:
        positions: integer tensor of positions ``>= 0``, any shape.
        floor_scale: the step, in positions (8192 in Llama 4); an int >= 1.
        attn_scale: the strength (0.1 in Llama 4); finite (0 turns the tuning off).

    Returns:
        float64 factors, the shape of ``positions``.

    Example:
        >>> nope_temperature(torch.tensor([0, 8190, 8191, 10**6])).tolist()[:3]
        [1.0, 1.0, 1.0693147180559945]
    """
    check_tensor("positions", positions)
    if (
        positions.is_floating_point()
        or positions.is_complex()
        or positions.dtype == torch.bool
    ):
        raise TypeError(
            "positions must be an integer tensor (token indices), got "
            f"{positions.dtype}"
        )
    floor_scale, attn_scale = _check_temperature_options(floor_scale, attn_scale)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(
            f"positions must be >= 0, got a minimum of {int(positions.min())}"
        )
    return _temperature(positions.to(torch.int64), floor_scale, attn_scale)


def temperature_tuned_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    floor_scale: int = 8192,
    attn_scale: float = 0.1,
) -> Tensor:
    r"""Attention of a NoPE layer with Llama 4's temperature tuning: each query times
    :func:`nope_temperature` of its position, then scaled dot-product attention.

    The ``i`` queries sit at the last ``i`` of the ``j`` key positions (row ``r`` at
    ``j - i + r``), as in self-attention and in decoding with a cache. A kernel on the
    package's contract, so a whole NoPE layer of Llama 4 is
    ``MultiHeadAttention(..., attention_fn=kernel)`` with no ``rope``, where ``kernel =
    functools.partial(temperature_tuned_attention, floor_scale=8192, attn_scale=0.1)``.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``, ``j >= i``.
        value: ``(..., h_kv, j, e)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``.
        is_causal: top-left causal mask (as in PyTorch); not with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: ``h`` a multiple of ``h_kv``.
        floor_scale, attn_scale: see :func:`nope_temperature`.

    Returns:
        ``(..., h, i, e)``. The factors are computed in float64 and applied in the
        query's dtype (float32 at least), as transformers applies them.

    Example:
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> out = temperature_tuned_attention(q, k, v, is_causal=True, floor_scale=2)
        >>> tau = nope_temperature(torch.arange(5), floor_scale=2).float()
        >>> plain = scaled_dot_product_attention(q * tau[:, None], k, v, is_causal=True)
        >>> torch.allclose(out, plain)
        True
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    floor_scale, attn_scale = _check_temperature_options(floor_scale, attn_scale)
    i, j = query.shape[-2], key.shape[-2]
    if i > j:
        raise ValueError(
            "the i queries are the last i of the j key positions, so i <= j is needed, "
            f"got i={i} and j={j}"
        )
    positions = torch.arange(j - i, j, device=query.device)  # (i,)
    tau = _temperature(positions, floor_scale, attn_scale)[:, None]  # (i, 1)
    wide = torch.promote_types(query.dtype, torch.float32)
    query = (query.to(wide) * tau.to(wide)).to(query.dtype)
    return scaled_dot_product_attention(
        query, key, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
    )
