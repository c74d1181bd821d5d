"""Diagrams of the Efficient-attention part (chapters 10-16), one section per chapter.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every mask, selection, state and
number a diagram shows is computed by the package on a tiny seeded example (the causal
mask, :func:`~attention.lightning_attention`, :func:`~attention.delta_rule_attention`,
:func:`~attention.gated_delta_rule_attention`, :func:`~attention.kimi_delta_attention`,
:class:`~attention.GatedDeltaNet`, the pattern builders of
:mod:`attention.efficient.patterns`, :func:`~attention.moba_attention`,
:func:`~attention.native_sparse_attention`) or counted from the shapes of the products
it draws, so the picture cannot drift from the mechanism it shows; each such cell or
text carries a ``gid`` naming what it shows (``pairs[i,j]``, ``U[r,c]``,
``pattern:window[j]``, ``score[c]`` ...) for the tests.

Shape legend: ``n`` positions, ``t`` the query followed, ``B`` a block size, ``w`` a
window. Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from matplotlib.patches import Rectangle

from ..._core import attention_scores, tril_mask
from ...efficient.delta_rule import (
    delta_rule_attention,
    gated_delta_rule_attention,
    kimi_delta_attention,
)
from ...efficient.distributed import ring_schedule
from ...efficient.gated_deltanet import GatedDeltaNet
from ...efficient.learned_sparse import moba_attention, native_sparse_attention
from ...efficient.linear import lightning_attention
from ...efficient.patterns import (
    bigbird_mask,
    dilated_mask,
    global_tokens_mask,
    sliding_window_mask,
)
from ...efficient.tiled import flash_tile_kinds, tiled_attention
from ...foundations.masks import causal_mask
from . import _draw as draw

__all__ = [
    "two_orders",
    "chunkwise_form",
    "memory_write_read",
    "chunkwise_delta",
    "gated_delta_update",
    "channel_decay",
    "qwen3_next_layer",
    "keys_a_query_sees",
    "block_selection",
    "nsa_branches",
    "online_tiles",
    "ring_steps",
    "program_grid",
]

# --------------------------------------------------------------------------- chapter 10


def _shape(*sizes) -> str:
    return "(" + ", ".join(str(s) for s in sizes) + ")"


def product_costs(n: int, d: int, e: int) -> dict[str, int]:
    """Multiply-adds of the two orders of :math:`Q K^\top V`, from the products' shapes.

    ``Q``, ``K`` ``(n, d)`` and ``V`` ``(n, e)`` are meta tensors (shapes, no data), so
    the two orders are multiplied at no cost at any ``n``; each matrix product of an
    ``(a, b)`` by a ``(b, c)`` matrix adds ``a b c`` multiply-adds.

    Returns:
        ``{"(QK^T)V": ..., "Q(K^TV)": ...}``, multiply-adds.
    """
    q, k = (torch.empty(n, d, device="meta") for _ in range(2))
    v = torch.empty(n, e, device="meta")

    def product(x, y, counted):
        counted.append(x.shape[0] * x.shape[1] * y.shape[1])
        return x @ y

    left: list[int] = []
    right: list[int] = []
    product(product(q, k.T, left), v, left)  # (QK^T) V
    product(q, product(k.T, v, right), right)  # Q (K^T V)
    return {"(QK^T)V": sum(left), "Q(K^TV)": sum(right)}


def _times(ax, x: float, y: float, symbol: str = "×") -> None:
    draw.label(ax, (x, y), symbol, size=draw.TITLE, colour=draw.MUTED)


def two_orders(n: int = 4096, d: int = 64, e: int = 64):
    """The two orders of one product, :math:`(QK^\\top)V = Q(K^\\top V)`.

    Top: the ``(n, n)`` matrix :math:`QK^\\top` first, then its product with ``V``.
    Bottom: the ``(d, e)`` matrix :math:`K^\\top V` first, then ``Q`` times it. The
    grids are drawn for ``n = 8``, ``d = e = 2`` (the shapes of seeded tensors
    multiplied by torch); the multiply-adds under each row are counted by
    :func:`product_costs` for the ``n``, ``d``, ``e`` given (``cost:<order>``), from
    the shapes of the two products each order multiplies.

    Returns:
        The Figure.
    """
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(8, 2, generator=g) for _ in range(2))
    v = torch.randn(8, 2, generator=g)
    scores, state = q @ k.T, k.T @ v  # (8, 8) and (2, 2): the two intermediates
    costs = product_costs(n, d, e)

    fig, ax = draw.canvas(7.2, 5.0, "Two orders of one product: (QKᵀ)V = Q(KᵀV)")
    cell = 0.15
    roles = {
        "Q": draw.ROLE["query"],
        "Kᵀ": draw.ROLE["key"],
        "V": draw.ROLE["value"],
        "QKᵀ": draw.ROLE["weight"],
        "KᵀV": draw.ROLE["weight"],
        "O": draw.ROLE["input"],
    }
    shapes = {
        "Q": ("n", "d"),
        "Kᵀ": ("d", "n"),
        "V": ("n", "e"),
        "QKᵀ": ("n", "n"),
        "KᵀV": ("d", "e"),
        "O": ("n", "e"),
    }
    sizes = {
        "Q": q.shape,
        "Kᵀ": k.T.shape,
        "V": v.shape,
        "QKᵀ": scores.shape,
        "KᵀV": state.shape,
        "O": (scores @ v).shape,
    }
    rows = (
        (3.4, ["Q", "Kᵀ", "=QKᵀ", "V", "=O"], "(QKᵀ)V"),
        (1.5, ["Kᵀ", "V", "=KᵀV", "then", "Q", "KᵀV", "=O"], "Q(KᵀV)"),
    )
    notes = {
        "(QKᵀ)V": "first an n × n matrix, which grows as n²: "
        f"{costs['(QK^T)V']:,} multiply-adds",
        "Q(KᵀV)": "first a d × e matrix, the same size for any n: "
        f"{costs['Q(K^TV)']:,} multiply-adds",
    }
    for y, names, order in rows:
        draw.label(ax, (0.25, y), order, ha="left", fontweight="bold")
        x, first = 1.35, True
        for r, name in enumerate(names):
            if name == "then":
                draw.label(ax, (x + 0.3, y), "then", size=draw.SMALL, colour=draw.MUTED)
                x, first = x + 0.6, True
                continue
            equal = name.startswith("=")
            name = name.lstrip("=")
            if not first:
                _times(ax, x + 0.06, y, "=" if equal else "×")
                x += 0.32
            first = False
            rows_, cols = sizes[name]
            bounds = draw.matrix(
                ax,
                (x + cols * cell / 2, y),
                rows_,
                cols,
                cell=cell,
                name=name,
                shape=_shape(*shapes[name]),
                colour=roles[name],
                gid=f"{order}:{name}:{r}",
            )
            x = bounds.right + 0.08
        text = draw.label(
            ax,
            (0.25, y - 0.95),
            notes[order],
            size=draw.SMALL,
            ha="left",
            colour=draw.MUTED,
        )
        text.set_gid(f"cost:{order}")
    draw.label(
        ax,
        (0.25, 0.22),
        f"multiply-adds for n = {n:,}, d = {d}, e = {e}",
        size=draw.SMALL,
        ha="left",
        colour=draw.MUTED,
    )
    return fig


def chunk_parts(n: int = 12, chunk: int = 4) -> torch.Tensor:
    """``(n, n)`` long: 0 a pair the causal mask hides, 1 a pair inside a chunk's tile,
    2 a pair reached through the state of the earlier chunks.

    Computed from the package's :func:`~attention.causal_mask` (True = may attend) and
    the chunk of each position, ``position // chunk``.
    """
    allowed = causal_mask(n)
    block = torch.arange(n) // chunk
    same = block[:, None] == block[None, :]
    return torch.where(allowed, torch.where(same, 1, 2), 0)


def chunkwise_form(n: int = 12, chunk: int = 4):
    """The chunked causal form: quadratic inside a chunk, a state between chunks.

    Left, the ``(n, n)`` query-key pairs of :func:`chunk_parts` (``pairs[i,j]``): the
    diagonal tiles are computed as small masked quadratic products, the pairs below
    them through the state. Right, chunk after chunk: each reads the state its
    predecessors wrote, then adds its own keys and values to it.

    Returns:
        The Figure.
    """
    parts = chunk_parts(n, chunk)
    colours = {0: draw.BLOCKED, 1: draw.ROLE["weight"], 2: draw.ROLE["key"]}
    fig, ax = draw.canvas(7.2, 4.75, "The chunked form: tiles inside, a state between")
    cell = 0.22
    grid = draw.matrix(
        ax,
        (1.6, 2.68),
        n,
        n,
        cell=cell,
        fills=[
            [draw.tint(colours[int(p)], 0.75 if p else 1) for p in r] for r in parts
        ],
        colour=draw.INK,
        gid="pairs",
    )
    for m in range(1, n // chunk):  # chunk borders
        x = grid.left + m * chunk * cell
        y = grid.top - m * chunk * cell
        ax.plot([x, x], [grid.bottom, grid.top], color=draw.INK, lw=1.4)
        ax.plot([grid.left, grid.right], [y, y], color=draw.INK, lw=1.4)
    draw.label(
        ax,
        (grid.centre[0], grid.top + 0.12),
        "key position j →",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="bottom",
    )
    draw.label(
        ax,
        (grid.left - 0.16, grid.centre[1]),
        "query position i →",
        size=draw.SMALL,
        colour=draw.MUTED,
        rotation=270,
    )
    draw.legend(
        ax,
        (grid.left, grid.bottom - 0.25),
        [
            (draw.tint(colours[1], 0.75), "inside a chunk: a masked tile"),
            (draw.tint(colours[2], 0.75), "earlier chunks: through the state"),
            (draw.BLOCKED, "future keys: never seen"),
        ],
        step=0.26,
    )
    # chunk after chunk, on the right, level with each chunk's rows
    x_box = 5.05
    for m in range(n // chunk):
        y = grid.top - (m + 0.5) * chunk * cell
        box = draw.box(
            ax,
            (x_box, y),
            f"chunk {m}: tile + φ(Q{_SUB[m]}) S{_SUB[m]}",
            width=2.5,
            colour=draw.ROLE["weight"],
            size=draw.SMALL,
        )
        ax.plot(
            [grid.right + 0.05, box.left - 0.05],
            [y, y],
            color=draw.GRID,
            lw=0.8,
            ls=":",
        )
        if m + 1 < n // chunk:
            below = y - chunk * cell
            draw.arrow(
                ax,
                (x_box, box.bottom),
                (x_box, below + 0.19),
                colour=draw.ROLE["key"],
            )
            text = (
                f"S{_SUB[m + 1]} = S{_SUB[m]} + φ(K{_SUB[m]})ᵀ V{_SUB[m]}"
                if m
                else "S₁ = φ(K₀)ᵀ V₀   (S₀ = 0)"
            )
            draw.label(
                ax,
                (x_box + 0.1, (box.bottom + below + 0.19) / 2),
                text,
                size=draw.SMALL,
                colour=draw.ROLE["key"],
                ha="left",
            )
    draw.label(
        ax,
        (x_box, grid.bottom - 0.3),
        f"n = {n}, chunks of c = {chunk}:\n"
        f"{n // chunk} sequential steps instead of {n}",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    return fig


_SUB = "₀₁₂₃₄₅₆₇₈₉"


# --------------------------------------------------------------------------- chapter 11


def memory_example():
    """The tiny example of :func:`memory_write_read`: ``(keys (3, 4), values (3, 3))``.

    The keys are three rows of a 4 x 4 Hadamard matrix divided by 2: unit length and
    orthogonal, with entries +-0.5. The values are small integers.
    """
    keys = 0.5 * torch.tensor(
        [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1]], dtype=torch.float64
    )
    values = torch.tensor([[1, 2, 0], [0, -1, 3], [2, 1, 1]], dtype=torch.float64)
    return keys, values


def memory_write_read(read: int = 1):
    """The state as a memory: written with outer products, read with a query.

    Top: three pairs written as outer products :math:`k_j v_j^\\top` (``write[j]``, the
    key as a column, the value as a row) and their sum :math:`S` (``S``), the final
    state of :func:`~attention.lightning_attention` run on the three pairs with no
    decay and no scale. Bottom: reading with :math:`q = k_{read}`: the dot products
    :math:`k_j \\cdot q` (``dot[j]``) weight the values, and :math:`S^\\top q`
    (``read``) returns the value stored under that key.

    Returns:
        The Figure.
    """
    keys, values = memory_example()
    _, state = lightning_attention(
        keys[None], keys[None], values[None], scale=1.0, output_final_state=True
    )
    S = state[0]  # (d, e)
    q = keys[read]
    out = q @ S  # (e,): S^T q
    dots = keys @ q  # (3,)
    fig, ax = draw.canvas(7.2, 4.45, "A memory written with kvᵀ and read with q")
    cell = 0.32
    key_c, value_c, state_c = draw.ROLE["key"], draw.ROLE["value"], draw.ROLE["weight"]
    y = 2.7
    draw.label(ax, (0.2, y), "write", ha="left", fontweight="bold")
    x = 0.85
    for j in range(len(keys)):
        kb = draw.matrix(
            ax,
            (x + cell / 2, y),
            4,
            1,
            cell=cell,
            values=keys[j][:, None],
            fmt="{:+.1f}",
            colour=key_c,
            size=draw.SMALL,
            gid=f"key[{j}]",
        )
        draw.label(
            ax,
            (kb.centre[0], kb.bottom - 0.08),
            f"k{_SUB[j + 1]}",
            colour=key_c,
            va="top",
        )
        grid = draw.matrix(
            ax,
            (kb.right + 0.06 + 1.5 * cell, y),
            4,
            3,
            cell=cell,
            values=torch.outer(keys[j], values[j]),
            fmt="{:.1f}",
            colour=state_c,
            size=draw.SMALL,
            gid=f"write[{j}]",
        )
        draw.matrix(
            ax,
            (grid.centre[0], grid.top + 0.06 + cell / 2),
            1,
            3,
            cell=cell,
            values=values[j][None],
            fmt="{:.0f}",
            colour=value_c,
            size=draw.SMALL,
            gid=f"value[{j}]",
        )
        draw.label(
            ax,
            (grid.centre[0], grid.top + 0.2 + cell),
            f"v{_SUB[j + 1]}ᵀ",
            colour=value_c,
            va="bottom",
        )
        draw.label(
            ax,
            (grid.centre[0], grid.bottom - 0.08),
            f"k{_SUB[j + 1]}v{_SUB[j + 1]}ᵀ",
            colour=draw.MUTED,
            va="top",
        )
        _times(ax, grid.right + 0.18, y, "+" if j < len(keys) - 1 else "=")
        x = grid.right + 0.36
    sb = draw.matrix(
        ax,
        (x + 1.5 * cell, y),
        4,
        3,
        cell=cell,
        values=S,
        fmt="{:.1f}",
        colour=state_c,
        size=draw.SMALL,
        gid="S",
    )
    draw.label(
        ax,
        (sb.centre[0], sb.top + 0.08),
        "S",
        colour=state_c,
        va="bottom",
        fontweight="bold",
    )
    draw.label(
        ax,
        (sb.centre[0], sb.bottom - 0.08),
        "(d, e)",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    # the read
    y = 1.0
    draw.label(ax, (0.2, y), "read", ha="left", fontweight="bold")
    qb = draw.matrix(
        ax,
        (0.85 + cell / 2, y),
        4,
        1,
        cell=cell,
        values=q[:, None],
        fmt="{:+.1f}",
        colour=draw.ROLE["query"],
        size=draw.SMALL,
        gid="query",
    )
    draw.label(
        ax,
        (qb.centre[0], qb.bottom - 0.08),
        f"q = k{_SUB[read + 1]}",
        colour=draw.ROLE["query"],
        va="top",
    )
    terms = " + ".join(f"{float(dots[j]):.0f}·v{_SUB[j + 1]}" for j in range(len(keys)))
    text = draw.label(
        ax, (qb.right + 0.2, y), f"Sᵀq = Σⱼ (kⱼ · q) vⱼ = {terms} =", ha="left"
    )
    text.set_gid("dots")
    rb = draw.matrix(
        ax,
        (4.55 + 1.5 * cell, y),
        1,
        3,
        cell=cell,
        values=out[None],
        fmt="{:.1f}",
        colour=value_c,
        size=draw.SMALL,
        gid="read",
    )
    draw.label(
        ax,
        (rb.centre[0], rb.bottom - 0.08),
        f"= v{_SUB[read + 1]}ᵀ, exactly:\nthe keys are orthonormal",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    return fig


def chunk_example():
    """The seeded example of :func:`chunkwise_delta`: ``(q, k, v, beta, c)`` for 8
    positions, ``d = 3``, ``e = 2``, unit keys, chunks of ``c = 4``."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(8, 3, generator=g, dtype=torch.float64)
    k = torch.nn.functional.normalize(
        torch.randn(8, 3, generator=g, dtype=torch.float64), dim=-1
    )
    v = torch.randn(8, 2, generator=g, dtype=torch.float64)
    beta = torch.rand(8, generator=g, dtype=torch.float64)
    return q, k, v, beta, 4


def chunk_pieces() -> dict[str, torch.Tensor]:
    """The pieces of the second chunk of :func:`chunk_example`, as drawn.

    ``S`` is the state after the first chunk (:func:`~attention.delta_rule_attention`'s
    final state); ``A``, ``W``, ``U~`` come from one unit lower-triangular solve; then
    ``U = U~ - W S``, the chunk's output ``O`` and the state ``S'`` after it.
    """
    q, k, v, beta, c = chunk_example()
    _, S = delta_rule_attention(
        q[None, :c],
        k[None, :c],
        v[None, :c],
        beta[None, :c],
        scale=1.0,
        output_final_state=True,
    )
    S = S[0]
    Q, K, V, b = q[c:], k[c:], v[c:], beta[c:]
    A = torch.where(tril_mask(c, c, offset=-1), b[:, None] * (K @ K.T), 0.0)
    T = torch.eye(c, dtype=q.dtype) + A
    W = torch.linalg.solve_triangular(T, b[:, None] * K, upper=False)
    U_tilde = torch.linalg.solve_triangular(T, b[:, None] * V, upper=False)
    U = U_tilde - W @ S
    out = Q @ S + torch.where(tril_mask(c, c), Q @ K.T, 0.0) @ U
    return {"S": S, "A": A, "W": W, "U~": U_tilde, "U": U, "O": out, "S'": S + K.T @ U}


def chunkwise_delta():
    """One chunk of the chunkwise delta rule (the WY/UT form), with its numbers.

    Top band, for every chunk at once (no state needed): the strictly lower
    ``(c, c)`` matrix ``A`` (``A[r,s]``) and one triangular solve for ``W`` and
    :math:`\\tilde U`. Bottom band, chunk after chunk: the corrections
    :math:`U = \\tilde U - W S` (``U[r,j]``), the output and the next state. The numbers
    are those of :func:`chunk_pieces` (the second chunk of :func:`chunk_example`).

    Returns:
        The Figure.
    """
    p = chunk_pieces()
    c = p["A"].shape[0]
    fig, ax = draw.canvas(7.3, 5.6, "The chunkwise delta rule: one triangular solve")
    cell = 0.38
    weight, value, key = draw.ROLE["weight"], draw.ROLE["value"], draw.ROLE["key"]
    small = {"size": draw.SMALL, "colour": draw.MUTED}
    # 1. every chunk at once: A, then one solve for U~ and W
    draw.label(ax, (0.2, 4.95), "1. every chunk at once", ha="left", fontweight="bold")
    y1 = 3.7
    lower = [[weight if s_ < r else draw.BLOCKED for s_ in range(c)] for r in range(c)]
    fills = [[draw.tint(f, 0.3) if f == weight else f for f in row] for row in lower]
    ab = draw.matrix(
        ax, (1.15, y1), c, c, cell=cell, fills=fills, colour=weight, name="A"
    )
    for r in range(c):
        for s_ in range(r):
            t = draw.label(
                ax,
                (ab.left + (s_ + 0.5) * cell, draw.row_centre(ab, r, cell)),
                f"{float(p['A'][r, s_]):.2f}",
                size=8,
            )
            t.set_gid(f"A[{r},{s_}]")
    draw.label(
        ax,
        (ab.centre[0], ab.bottom - 0.08),
        "tril(diag(β) K Kᵀ, −1)",
        va="top",
        **small,
    )
    solve = draw.box(
        ax,
        (3.3, y1),
        "solve (I + A) [Ũ  W]\n= diag(β) [V  K]",
        width=1.95,
        colour=weight,
        size=draw.SMALL,
    )
    draw.arrow(ax, ab.east, solve.west)
    ub = draw.matrix(
        ax,
        (5.0, y1),
        c,
        2,
        cell=cell,
        values=p["U~"],
        fmt="{:.2f}",
        colour=value,
        size=8,
        gid="U~",
        name="Ũ",
        shape="(c, e)",
    )
    wb = draw.matrix(
        ax,
        (6.45, y1),
        c,
        3,
        cell=cell,
        values=p["W"],
        fmt="{:.2f}",
        colour=key,
        size=8,
        gid="W",
        name="W",
        shape="(c, d)",
    )
    draw.arrow(ax, solve.east, ub.west)
    # 2. chunk after chunk: the corrections, the output, the state
    draw.label(ax, (0.2, 2.45), "2. chunk after chunk", ha="left", fontweight="bold")
    y2 = 1.75
    sb = draw.matrix(
        ax,
        (3.3, y2),
        3,
        2,
        cell=cell,
        values=p["S"],
        fmt="{:.2f}",
        colour=weight,
        size=8,
        gid="S",
        shape="(d, e)",
    )
    draw.label(
        ax,
        (sb.left - 0.1, sb.centre[1]),
        "S, as the\nchunk enters",
        ha="right",
        colour=weight,
    )
    corr = draw.box(ax, (5.0, y2), "U = Ũ − W S", colour=value, size=draw.SMALL)
    draw.arrow(ax, sb.east, corr.west)
    draw.arrow(ax, (ub.centre[0], ub.bottom - 0.3), corr.north)
    draw.arrow(ax, (wb.centre[0] - 0.3, wb.bottom - 0.3), (corr.right - 0.1, corr.top))
    cb = draw.matrix(
        ax,
        (6.45, y2),
        c,
        2,
        cell=cell,
        values=p["U"],
        fmt="{:.2f}",
        colour=value,
        size=8,
        gid="U",
        shape="(c, e)",
    )
    draw.label(
        ax,
        (cb.right + 0.08, cb.centre[1]),
        "U",
        colour=value,
        ha="left",
        fontweight="bold",
    )
    draw.arrow(ax, corr.east, cb.west)
    out = draw.box(
        ax,
        (2.9, 0.45),
        "O = Q S + tril(Q Kᵀ) U",
        colour=draw.ROLE["query"],
        size=draw.SMALL,
        width=2.2,
    )
    nxt = draw.box(
        ax,
        (6.05, 0.45),
        "next chunk's S = S + Kᵀ U",
        colour=weight,
        size=draw.SMALL,
        width=2.3,
    )
    draw.arrow(ax, (cb.left + 0.05, cb.bottom + 0.05), out.east)
    draw.arrow(ax, (cb.centre[0], cb.bottom - 0.28), (cb.centre[0], nxt.top))
    return fig


# --------------------------------------------------------------------------- chapter 13

#: Colours of the parts of a pattern: window keys, global keys, random keys, a chosen
#: block; hidden keys are ``draw.BLOCKED``.
_WINDOW, _GLOBAL, _RANDOM = draw.MAY_ATTEND, draw.ROLE["query"], draw.ROLE["value"]
_CHOSEN = draw.ROLE["key"]


def pattern_rows(n: int = 20, query: int = 10) -> dict[str, torch.Tensor]:
    """The rows drawn by :func:`keys_a_query_sees`: ``{name: (n,) long}``, 0 for a
    hidden key, 1 a window (or dilated) key, 2 a global key, 3 a random key.

    Computed from the package's masks: ``sliding_window_mask``, ``dilated_mask``,
    ``global_tokens_mask`` and ``bigbird_mask`` (seed 0), row ``query``.
    """
    w = 2
    window = sliding_window_mask(n, w)[query]
    causal = sliding_window_mask(n, w, is_causal=True)[query]
    dilated = dilated_mask(n, w, 3)[query]
    glob = global_tokens_mask(n, w, [0])[query]
    big = bigbird_mask(n, w, 1, 2, seed=0)[query]
    is_global = torch.arange(n) == 0
    rows = {
        f"window, w = {w}": window.long(),
        f"causal window, w = {w}": causal.long(),
        f"dilated, w = {w}, r = 3": dilated.long(),
        "window + global token 0": glob.long() + (glob & is_global).long(),
    }
    bb = big.long()
    bb[is_global & big] = 2
    bb[big & ~window & ~is_global] = 3
    rows["BigBird: + 2 random keys"] = bb
    return rows


def keys_a_query_sees():
    """The keys one query sees under five fixed patterns, one strip of keys each.

    Query 10 of 20 positions; dark cells are keys in its window (or its dilated
    window), blue a global token, green BigBird's random keys, light the keys it never
    sees. The count of seen keys is written after each strip (``count:<name>``).

    Returns:
        The Figure.
    """
    n, query = 20, 10
    rows = pattern_rows(n, query)
    fig, ax = draw.canvas(7.2, 3.5, "The keys one query sees under fixed patterns")
    cell, left = 0.22, 2.1
    colours = {0: draw.BLOCKED, 1: _WINDOW, 2: _GLOBAL, 3: _RANDOM}
    top = 2.72
    for r, (name, row) in enumerate(rows.items()):
        y = top - 0.4 * r
        bounds = draw.matrix(
            ax,
            (left + n * cell / 2, y),
            1,
            n,
            cell=cell,
            fills=[[colours[int(v)] for v in row]],
            colour=draw.INK,
            gid=f"pattern:{name}",
        )
        draw.label(ax, (bounds.left - 0.12, y), name, size=draw.SMALL, ha="right")
        count = draw.label(
            ax,
            (bounds.right + 0.1, y),
            f"{int((row > 0).sum())} keys",
            size=draw.SMALL,
            ha="left",
        )
        count.set_gid(f"count:{name}")
        if r == 0:
            for j in (0, 5, 10, 15, 19):
                draw.label(
                    ax,
                    (bounds.left + (j + 0.5) * cell, bounds.top + 0.08),
                    str(j),
                    size=draw.SMALL,
                    colour=draw.MUTED,
                    va="bottom",
                )
    x = left + (query + 0.5) * cell
    bottom = top - 0.4 * (len(rows) - 1) - cell / 2
    draw.arrow(ax, (x, bottom - 0.32), (x, bottom - 0.02), colour=draw.INK)
    draw.label(
        ax,
        (x, bottom - 0.36),
        f"the query ({query})",
        size=draw.SMALL,
        va="top",
    )
    draw.legend(
        ax,
        (0.3, 0.62),
        [(_WINDOW, "window keys"), (_GLOBAL, "global token")],
    )
    draw.legend(
        ax,
        (5.55, 0.62),
        [(_RANDOM, "random keys"), (draw.BLOCKED, "never seen")],
    )
    return fig


def block_example():
    """The tiny seeded example of :func:`block_selection`: ``(q, k, t, B, top_k)``,
    one query row ``q`` ``(n, d)`` is the query followed, ``t`` its position."""
    n, d, block, top_k, t = 16, 4, 4, 2, 13
    g = torch.Generator().manual_seed(4)
    q = torch.randn(n, d, generator=g, dtype=torch.float64)
    k = torch.randn(n, d, generator=g, dtype=torch.float64)
    return q, k, t, block, top_k


def block_selection():
    """MoBA's gate: a query scores each past block by its mean key and keeps the best.

    16 keys in 4 blocks of 4; query 13 sits in block 3. The mean of each block's keys is
    its summary; the query's dot product with the summaries of the past blocks is
    printed (``score[c]``) and the best ``top_k - 1 = 1`` is kept, with the query's own
    block, which is kept whatever its score (its mean holds future keys). The choice
    drawn is :func:`~attention.moba_attention`'s (``chosen[j]`` on the key strip).

    Returns:
        The Figure.
    """
    q, k, t, block, top_k = block_example()
    n = k.shape[0]
    nb = n // block
    means = k.view(nb, block, -1).mean(dim=1)  # (nb, d)
    scores = means @ q[t]  # (nb,)
    _, blocks = moba_attention(
        q[None, None],
        k[None, None],
        k[None, None],
        block_size=block,
        top_k=top_k,
        return_block_indices=True,
    )
    kept = {int(c) for c in blocks[0, 0, t] if c >= 0}
    own = t // block

    fig, ax = draw.canvas(7.2, 3.55, "Choosing blocks by their mean key (MoBA)")
    cell, left = 0.3, 1.3
    y_keys, y_means, y_kept = 2.55, 1.55, 0.62
    # the keys, in blocks
    fills = [[draw.tint(draw.ROLE["key"]) for _ in range(n)]]
    keys = draw.matrix(
        ax, (left + n * cell / 2, y_keys), 1, n, cell=cell, fills=fills, gid="keys"
    )
    draw.label(ax, (keys.left - 0.12, y_keys), "keys", ha="right")
    for c in range(nb):
        x0 = keys.left + c * block * cell
        draw.bracket(
            ax,
            (x0 + 0.03, keys.top + 0.05),
            (x0 + block * cell - 0.03, keys.top + 0.05),
            f"block {c}",
            side="above",
        )
    query = draw.Bounds(keys.left + t * cell, keys.bottom, cell, cell)
    draw.outline(ax, query, colour=draw.ROLE["query"])
    draw.label(
        ax,
        (query.centre[0], query.bottom - 0.08),
        f"query {t}",
        size=draw.SMALL,
        colour=draw.ROLE["query"],
        va="top",
    )
    # the mean keys and the scores
    for c in range(nb):
        centre = (keys.left + (c + 0.5) * block * cell, y_means)
        fill = draw.tint(draw.ROLE["key"], 0.5 if c != own else 0.15)
        mean = draw.matrix(
            ax, centre, 1, 1, cell=0.42, fills=[[fill]], gid=f"mean[{c}]"
        )
        draw.label(ax, mean.centre, f"$\\bar k_{c}$", size=12)
        draw.arrow(
            ax,
            (centre[0], keys.bottom - 0.2),
            (centre[0], mean.top),
            colour=draw.MUTED,
        )
        if c in kept:
            draw.outline(ax, mean, colour=_CHOSEN)
        if c < own:
            text = draw.label(
                ax,
                (mean.right + 0.1, y_means),
                f"{float(scores[c]):.2f}",
                ha="left",
                fontweight="bold" if c in kept else "normal",
            )
            text.set_gid(f"score[{c}]")
        else:
            draw.label(
                ax,
                (mean.right + 0.08, y_means),
                "own block:\nalways kept",
                size=draw.SMALL,
                ha="left",
                colour=draw.MUTED,
            )
    draw.label(ax, (keys.left - 0.12, y_means), "mean key\nand score", ha="right")
    # the keys the query attends to
    chosen = [
        _CHOSEN if (j // block in kept and j <= t) else draw.BLOCKED for j in range(n)
    ]
    strip = draw.matrix(
        ax,
        (left + n * cell / 2, y_kept),
        1,
        n,
        cell=cell,
        fills=[chosen],
        colour=draw.INK,
        gid="chosen",
    )
    draw.label(ax, (strip.left - 0.12, y_kept), "attended", ha="right")
    draw.label(
        ax,
        (strip.centre[0], strip.bottom - 0.08),
        f"top_k = {top_k}: the best past block and the own block "
        f"(causal inside it: keys up to {t})",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    return fig


def nsa_example():
    """The tiny seeded example of :func:`nsa_branches`: ``(q, k, v, t, B, s, w)``."""
    n, d, block, selected, window, t = 24, 4, 4, 4, 4, 21
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 1, n, d, generator=g, dtype=torch.float64) for _ in "qkv")
    return q, k, v, t, block, selected, window


def nsa_branches():
    """NSA's three branches for one query, and the gate that mixes them.

    24 keys in blocks of 4; query 21. The compressed branch attends to the mean-pooled
    blocks that are complete (``pooled[c]``); the selected branch to the keys of the
    blocks :func:`~attention.native_sparse_attention` keeps (``selected[j]``: the first,
    the previous and the own block always, and the best-ranked other one); the window
    branch to the last ``w`` keys (``window[j]``). Their outputs are summed with gates.

    Returns:
        The Figure.
    """
    q, k, v, t, block, selected, window = nsa_example()
    n = k.shape[-2]
    nb = n // block
    _, blocks = native_sparse_attention(
        q,
        k,
        v,
        block_size=block,
        num_selected_blocks=selected,
        window_size=window,
        return_block_indices=True,
    )
    kept = {int(c) for c in blocks[0, 0, t] if c >= 0}
    complete = [(c + 1) * block - 1 <= t for c in range(nb)]

    fig, ax = draw.canvas(7.2, 3.5, "Native sparse attention: three branches, one gate")
    cell, left = 0.14, 1.5
    rows = (2.6, 1.7, 0.8)
    names = ("compressed", "selected", "window")
    notes = (
        "mean of each complete block",
        f"{selected} blocks: first, previous, own + best",
        f"the last {window} keys",
    )
    future = draw.tint(draw.GRID, 0.15)  # keys after the query: never seen

    def key_fill(j, on, colour):
        if j > t:
            return future
        return colour if on else draw.BLOCKED

    strips = []
    # compressed: one cell per block, as wide as the block's keys
    width = n * cell
    y = rows[0] - cell / 2
    for c in range(nb):
        colour = draw.ROLE["weight"] if complete[c] else draw.BLOCKED
        patch = Rectangle(
            (left + c * block * cell, y),
            block * cell,
            cell,
            facecolor=colour,
            edgecolor=draw.GRID,
            lw=0.6,
        )
        patch.set_gid(f"pooled[{c}]")
        ax.add_patch(patch)
    ax.add_patch(
        Rectangle((left, y), width, cell, fill=False, edgecolor=draw.INK, lw=1.6)
    )
    strips.append(draw.Bounds(left, y, width, cell))
    chosen = [key_fill(j, j // block in kept, _CHOSEN) for j in range(n)]
    recent = [key_fill(j, t - window < j <= t, _WINDOW) for j in range(n)]
    for y, fills, gid in ((rows[1], chosen, "selected"), (rows[2], recent, "window")):
        strips.append(
            draw.matrix(
                ax,
                (left + width / 2, y),
                1,
                n,
                cell=cell,
                fills=[fills],
                colour=draw.INK,
                gid=gid,
            )
        )
    for strip, name, note in zip(strips, names, notes):
        draw.label(ax, (strip.left - 0.12, strip.centre[1]), name, ha="right")
        draw.label(
            ax,
            (strip.left, strip.bottom - 0.06),
            note,
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="left",
            va="top",
        )
        if strip is not strips[0]:
            draw.outline(
                ax,
                draw.Bounds(left + t * cell, strip.bottom, cell, cell),
                colour=draw.ROLE["query"],
                pad=0.03,
            )
    draw.label(
        ax,
        (left + (t + 0.5) * cell, strips[0].top + 0.1),
        f"query {t}",
        size=draw.SMALL,
        colour=draw.ROLE["query"],
        va="bottom",
    )
    # the gate: one weight per branch, then the sum
    gates = []
    for strip, symbol in zip(strips, ("cmp", "slc", "swa")):
        gate = draw.box(
            ax,
            (strip.right + 0.72, strip.centre[1]),
            f"$o^{{{symbol}}}_t \\times g^{{{symbol}}}_t$",
            width=1.1,
            height=0.5,
            size=12,
        )
        draw.arrow(ax, strip.east, gate.west)
        gates.append(gate)
    total = draw.box(ax, (6.78, rows[1]), "$o_t$", width=0.55, height=0.5, size=12)
    draw.label(ax, (total.centre[0], total.top + 0.08), "sum", va="bottom")
    for gate in gates:
        draw.arrow(ax, gate.east, total.west)
    draw.label(
        ax,
        (left, 0.3),
        f"light: not attended;  palest: after the query (keys {t + 1} to {n - 1})",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig


# --------------------------------------------------------------------------- chapter 14


def online_tiles_example():
    """The tiny seeded example of :func:`online_tiles`: ``(q, k, v, B, query)``.

    9 queries and 12 keys of size 4 (float64), blocks of ``B = 3``; ``query`` (6) is
    the first query of the last query block, whose state the diagram follows.
    """
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (9, 12, 12))
    return q, k, v, 3, 6


def online_states(q, k, v, block: int, query: int) -> list[tuple[float, float]]:
    """``(m, l)`` of one query after each key block: its running maximum and sum.

    Computed by the package: ``m`` is the largest scaled score seen so far
    (:func:`~attention._core.attention_scores`), and ``l = exp(lse - m)`` with ``lse``
    the log-sum-exp that :func:`~attention.tiled_attention` returns for the keys seen
    so far: the state after ``t`` blocks is attention over those keys.
    """
    scores, _ = attention_scores(q[query : query + 1], k)  # (1, j), scaled
    states = []
    for end in range(block, k.shape[0] + block, block):
        m = scores[0, :end].max()
        _, lse = tiled_attention(
            q[query : query + 1], k[:end], v[:end], return_lse=True
        )
        states.append((float(m), float(torch.exp(lse[0] - m))))
    return states


def online_tiles():
    """FlashAttention's tiles: a query block meets the key blocks one after another.

    The scores of 9 queries and 12 keys are cut into 3 x 4 tiles (blocks of 3). The
    program of the last query block visits its tiles from left to right; beneath each
    tile, the running maximum ``m`` and running sum ``l`` of its first query after that
    block (``m[t]``, ``l[t]``), and between them the factor ``exp(m - m')`` that
    rescales the sum and the accumulator when the maximum grows (``rescale[t]``). The
    numbers come from :func:`online_states`.

    Returns:
        The Figure.
    """
    q, k, v, block, query = online_tiles_example()
    states = online_states(q, k, v, block, query)
    n_q, n_k = q.shape[0] // block, k.shape[0] // block
    fig, ax = draw.canvas(
        7.2, 3.75, "FlashAttention's tiles: a query block meets the key blocks in turn"
    )
    width, height, left, top = 0.95, 0.38, 1.45, 2.95
    last = n_q - 1
    for r in range(n_q):
        for c in range(n_k):
            fill = (
                draw.tint(draw.ROLE["query"], 0.35)
                if r == last
                else draw.tint(draw.ROLE["input"], 0.15)
            )
            x, y = left + c * width, top - (r + 1) * height
            patch = Rectangle(
                (x, y), width, height, facecolor=fill, edgecolor=draw.GRID, lw=0.6
            )
            patch.set_gid(f"tile[{r},{c}]")
            ax.add_patch(patch)
            draw.label(
                ax, (x + width / 2, y + height / 2), f"$Q_{r} K_{c}^\\top$", size=12
            )
        draw.label(
            ax,
            (left - 0.1, top - (r + 0.5) * height),
            f"queries {r * block}-{r * block + block - 1}",
            size=draw.SMALL,
            ha="right",
        )
    for c in range(n_k):
        draw.label(
            ax,
            (left + (c + 0.5) * width, top + 0.06),
            f"keys {c * block}-{c * block + block - 1}",
            size=draw.SMALL,
            colour=draw.MUTED,
            va="bottom",
        )
    row = draw.Bounds(left, top - n_q * height, n_k * width, height)
    draw.outline(ax, row, colour=draw.ROLE["query"])
    draw.label(
        ax,
        (row.right + 0.12, row.centre[1]),
        "one program:\nthis query block,\nkey blocks in turn",
        size=draw.SMALL,
        ha="left",
    )
    # the state of the followed query after each key block
    y_box, box_w = 1.02, 0.74
    boxes = []
    for c, (m, total) in enumerate(states):
        centre = (left + (c + 0.5) * width, y_box)
        box = draw.box(
            ax, centre, f"m = {m:.2f}\nℓ = {total:.2f}", width=box_w, size=8.5
        )
        ax.texts[-1].set_gid(f"state[{c}]")
        draw.arrow(ax, (centre[0], row.bottom), (centre[0], box.top), colour=draw.MUTED)
        boxes.append(box)
    for c in range(1, len(states)):
        a, b = boxes[c - 1], boxes[c]
        draw.arrow(ax, a.east, b.west)
        factor = math.exp(states[c - 1][0] - states[c][0])
        text = draw.label(
            ax,
            ((a.right + b.left) / 2, a.bottom - 0.08),
            f"×{factor:.2f}",
            size=draw.SMALL,
            colour=draw.MUTED,
            va="top",
        )
        text.set_gid(f"rescale[{c}]")
    end = draw.box(
        ax,
        (boxes[-1].right + 0.95, y_box),
        "O = acc / ℓ\nlse = m + log ℓ",
        width=1.4,
        size=8.5,
    )
    draw.arrow(ax, boxes[-1].east, end.west)
    draw.label(
        ax,
        (left - 0.1, y_box),
        f"query {query}\nafter each block",
        size=draw.SMALL,
        ha="right",
    )
    draw.label(
        ax,
        (0.3, 0.3),
        "State carried from tile to tile: running max m, running sum ℓ, unnormalised "
        "output acc.\nWhen m grows to m′, ℓ and acc are multiplied by exp(m − m′) "
        "(the factor under each arrow).",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig


# --------------------------------------------------------------------------- chapter 15

#: Fills of the ring's work: none, half a block of (N/P)^2 scores, a whole block.
_WORK_FILLS = {
    0.0: draw.BLOCKED,
    0.5: draw.tint(draw.ROLE["value"], 0.45),
    1.0: draw.ROLE["value"],
}


def ring_work(world_size: int, layout: str) -> list[list[float]]:
    """``work[t][r]``: the causal scores rank ``r`` computes at step ``t`` of the ring.

    In units of one contiguous block of ``(N/P)^2`` scores, from
    :func:`~attention.efficient.distributed.ring_schedule` (the schedule
    :func:`~attention.ring_attention` runs): a full pair of chunks counts its area, a
    diagonal pair half of it; a zigzag chunk is half as long, so its pairs count a
    quarter as much.
    """
    area = 1.0 if layout == "contiguous" else 0.25
    schedule = ring_schedule(world_size, layout=layout, is_causal=True)
    return [
        [
            sum(area * (1.0 if kind == "full" else 0.5) for *_, kind in entry["pairs"])
            for entry in step
        ]
        for step in schedule
    ]


def _chunks(rank: int, world_size: int, layout: str) -> list[int]:
    """The chunks rank ``rank`` holds: one of ``P``, or two of ``2P`` (zigzag)."""
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def ring_steps():
    """The ring's steps, P = 4, causal: who holds which keys, and the work it does.

    Two tables, contiguous and zigzag layout: row ``t`` is a step, column ``r`` a rank.
    A cell names the chunks of keys and values rank ``r`` holds at step ``t`` (those of
    rank ``(r - t) mod P``, from :func:`~attention.efficient.distributed.ring_schedule`;
    gid ``held:<layout>[t,r]``) and is filled by the causal work it does there
    (:func:`ring_work`). Under each column, the rank's total (``total:<layout>[r]``).

    Returns:
        The Figure.
    """
    p = 4
    schedule = ring_schedule(p)
    fig, ax = draw.canvas(
        7.3, 3.95, "The ring, P = 4 ranks: keys and values move one rank per step"
    )
    draw.label(
        ax,
        (3.65, 3.38),
        "Each rank keeps its queries; at step t rank r holds the keys and values of "
        "rank (r − t) mod P. Cells: the chunks held.",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    width, height, top = 0.6, 0.36, 2.62
    for layout, left in (("contiguous", 1.0), ("zigzag", 4.65)):
        work = ring_work(p, layout)
        draw.label(
            ax,
            (left + p * width / 2, top + 0.5),
            f"{layout} layout, causal",
            fontweight="bold",
        )
        for r in range(p):
            queries = ",".join(str(c) for c in _chunks(r, p, layout))
            draw.label(
                ax,
                (left + (r + 0.5) * width, top + 0.05),
                f"rank {r}\nq: {queries}",
                size=draw.SMALL,
                colour=draw.MUTED,
                va="bottom",
            )
        for t, step in enumerate(schedule):
            y = top - (t + 1) * height
            draw.label(
                ax,
                (left - 0.08, y + height / 2),
                f"step {t}",
                size=draw.SMALL,
                ha="right",
            )
            for r, entry in enumerate(step):
                fill = _WORK_FILLS[work[t][r]]
                x = left + r * width
                ax.add_patch(
                    Rectangle(
                        (x, y),
                        width,
                        height,
                        facecolor=fill,
                        edgecolor=draw.GRID,
                        lw=0.6,
                    )
                )
                held = ",".join(str(c) for c in _chunks(entry["source"], p, layout))
                text = draw.label(
                    ax,
                    (x + width / 2, y + height / 2),
                    held,
                    size=draw.SMALL,
                    colour=draw.ink_on(fill),
                )
                text.set_gid(f"held:{layout}[{t},{r}]")
        bottom = top - p * height
        ax.add_patch(
            Rectangle(
                (left, bottom),
                p * width,
                p * height,
                fill=False,
                edgecolor=draw.INK,
                lw=1.4,
            )
        )
        draw.label(
            ax, (left - 0.08, bottom - 0.17), "total", size=draw.SMALL, ha="right"
        )
        for r in range(p):
            total = sum(row[r] for row in work)
            text = draw.label(
                ax,
                (left + (r + 0.5) * width, bottom - 0.17),
                f"{total:g}",
                size=draw.SMALL,
                fontweight="bold",
            )
            text.set_gid(f"total:{layout}[{r}]")
    items = [
        (_WORK_FILLS[0.0], "skipped: all keys after all queries"),
        (_WORK_FILLS[0.5], "half a block of (N/P)² scores"),
        (_WORK_FILLS[1.0], "a full block"),
    ]
    for (fill, text), x in zip(items, (0.35, 3.05, 5.45)):
        draw.legend(ax, (x, 0.4), [(fill, text)])
    return fig


# --------------------------------------------------------------------------- chapter 16

#: Fills of the tiles of :func:`program_grid`, by kind (0, 1, 2 of flash_tile_kinds).
_TILE_FILLS = {
    0: draw.BLOCKED,
    1: draw.tint(draw.ROLE["key"], 0.35),
    2: draw.ROLE["key"],
}


def program_grid():
    """A launch grid of programs, and the key blocks one causal program visits.

    ``i = j = 64``, blocks of 16, ``b·h = 3``: the forward kernel runs a grid of
    ``(cdiv(i, 16), b·h) = (4, 3)`` programs, one per query block and batch·head
    (``program[m,z]``). Program ``(2, 1)`` is followed: on the right, the causal tiles
    of its batch·head, from :func:`~attention.efficient.tiled.flash_tile_kinds`
    (``tile[m,n]``), its own row outlined and numbered in the order it visits them.

    Returns:
        The Figure.
    """
    i, block, heads, followed = 64, 16, 3, (2, 1)
    kinds = flash_tile_kinds(i, i, block, is_causal=True)
    n_m = kinds.shape[0]
    fig, ax = draw.canvas(
        7.2, 3.45, "One program per query block: the grid and one program's tiles"
    )
    # the grid: program_id(0) along x, program_id(1) along y
    cell, left, top = 0.44, 1.45, 2.55
    for z in range(heads):
        for m in range(n_m):
            chosen = (m, z) == followed
            fill = draw.tint(draw.ROLE["query"], 0.6 if chosen else 0.15)
            x, y = left + m * cell, top - (z + 1) * cell
            patch = Rectangle(
                (x, y), cell, cell, facecolor=fill, edgecolor=draw.GRID, lw=0.6
            )
            patch.set_gid(f"program[{m},{z}]")
            ax.add_patch(patch)
            draw.label(ax, (x + cell / 2, y + cell / 2), f"{m},{z}", size=draw.SMALL)
    grid = draw.Bounds(left, top - heads * cell, n_m * cell, heads * cell)
    draw.outline(
        ax,
        draw.Bounds(
            left + followed[0] * cell, top - (followed[1] + 1) * cell, cell, cell
        ),
        colour=draw.ROLE["query"],
        pad=0.02,
    )
    draw.label(
        ax,
        (grid.centre[0], grid.top + 0.1),
        f"grid ({n_m}, {heads}): (cdiv(i, B), b·h)",
        size=draw.SMALL,
        va="bottom",
    )
    draw.label(
        ax,
        (grid.centre[0], grid.bottom - 0.1),
        "query block m = program_id(0)",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    draw.label(
        ax,
        (grid.left - 0.12, grid.centre[1]),
        "batch·head z\n= program_id(1)",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="right",
    )
    # the tiles of one batch·head: rows are programs, columns key blocks
    tile, t_left, t_top = 0.4, 4.3, 2.7
    for m in range(n_m):
        for n in range(kinds.shape[1]):
            fill = _TILE_FILLS[int(kinds[m, n])]
            x, y = t_left + n * tile, t_top - (m + 1) * tile
            patch = Rectangle(
                (x, y), tile, tile, facecolor=fill, edgecolor=draw.GRID, lw=0.6
            )
            patch.set_gid(f"tile[{m},{n}]")
            ax.add_patch(patch)
        draw.label(
            ax,
            (t_left - 0.08, t_top - (m + 0.5) * tile),
            f"m = {m}",
            size=draw.SMALL,
            ha="right",
        )
    visited = [n for n in range(kinds.shape[1]) if kinds[followed[0], n] > 0]
    for step, n in enumerate(visited, start=1):
        fill = _TILE_FILLS[int(kinds[followed[0], n])]
        text = draw.label(
            ax,
            (t_left + (n + 0.5) * tile, t_top - (followed[0] + 0.5) * tile),
            str(step),
            size=9,
            colour=draw.ink_on(fill),
            fontweight="bold",
        )
        text.set_gid(f"visit[{n}]")
    tiles = draw.Bounds(t_left, t_top - n_m * tile, kinds.shape[1] * tile, n_m * tile)
    draw.outline(
        ax,
        draw.Bounds(t_left, t_top - (followed[0] + 1) * tile, tiles.width, tile),
        colour=draw.ROLE["query"],
        pad=0.02,
    )
    draw.label(
        ax,
        (tiles.centre[0], tiles.top + 0.1),
        f"causal tiles of z = {followed[1]}, i = j = {i}, B = {block}",
        size=draw.SMALL,
        va="bottom",
    )
    draw.label(
        ax,
        (tiles.centre[0], tiles.bottom - 0.1),
        "key block n",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    start = (grid.right + 0.08, top - (followed[1] + 0.5) * cell)
    draw.arrow(
        ax,
        start,
        (tiles.left - 0.62, t_top - (followed[0] + 0.5) * tile),
        text="its row",
        colour=draw.ROLE["query"],
    )
    draw.legend(
        ax,
        (tiles.right + 0.15, tiles.top - 0.2),
        [
            (_TILE_FILLS[1], "no mask"),
            (_TILE_FILLS[2], "masked"),
            (_TILE_FILLS[0], "not loaded"),
        ],
    )
    draw.label(
        ax,
        (0.35, 0.42),
        "Numbers: the order in which program (2, 1) folds its key blocks into its "
        "running state.\nIt loads its block of queries once and writes its rows of "
        "the output once.",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig


# --------------------------------------------------------------------------- chapter 12


def gated_delta_example():
    """The tiny seeded step of :func:`gated_delta_update`: ``(S, k, v, beta, alpha)``.

    ``S`` ``(d, e) = (3, 2)`` is the state before the step, ``k`` a unit key ``(d,)``,
    ``v`` a value ``(e,)``, ``beta`` the step size and ``alpha`` the decay (floats).
    """
    g = torch.Generator().manual_seed(12)
    state = torch.randn(3, 2, generator=g, dtype=torch.float64)
    key = torch.nn.functional.normalize(
        torch.randn(3, generator=g, dtype=torch.float64), dim=0
    )
    value = torch.randn(2, generator=g, dtype=torch.float64)
    return state, key, value, 0.8, 0.9


def gated_delta_stages() -> dict[str, torch.Tensor]:
    """The four states of :func:`gated_delta_update`, and the read and the correction.

    ``before`` :math:`S_{t-1}`, ``decayed`` :math:`\\alpha S_{t-1}`, ``read``
    :math:`(\\alpha S_{t-1})^\\top k`, ``corrected``
    :math:`(I - \\beta k k^\\top)\\,\\alpha S_{t-1}`, ``after`` :math:`S_t`, the last
    from :func:`~attention.gated_delta_rule_attention` (one token, ``initial_state``).
    """
    state, key, value, beta, alpha = gated_delta_example()
    decayed = alpha * state
    read = decayed.T @ key  # (e,): what the decayed memory returns for k
    corrected = decayed - beta * torch.outer(key, read)
    one = torch.ones(1, 1, dtype=torch.float64)
    _, after = gated_delta_rule_attention(
        key[None, None],  # the query is not used for the state
        key[None, None],
        value[None, None],
        beta * one,
        math.log(alpha) * one,
        initial_state=state[None],
        output_final_state=True,
    )
    return {
        "before": state,
        "decayed": decayed,
        "read": read,
        "corrected": corrected,
        "after": after[0],
    }


def gated_delta_update():
    """One step of the gated delta rule as three moves: decay, correct, write.

    A ``(3, 2)`` state :math:`S_{t-1}` is decayed by :math:`\\alpha`; the memory's
    answer for the key, :math:`r = (\\alpha S_{t-1})^\\top k`, is read from the decayed
    state, and a step :math:`\\beta` of it is taken out along :math:`k`; then
    :math:`\\beta k v^\\top` is written. The numbers (``before``, ``decayed``,
    ``corrected``, ``after``, ``key``, ``value``, ``read``) are computed; ``after`` is
    :func:`~attention.gated_delta_rule_attention`'s state after the token.

    Returns:
        The Figure.
    """
    state, key, value, beta, alpha = gated_delta_example()
    st = gated_delta_stages()
    fig, ax = draw.canvas(7.3, 3.45, "One gated delta step: decay, correct, then write")
    cell, mid = 0.4, 2.05
    xs = (0.95, 2.85, 4.75, 6.55)
    names = ("$S_{t-1}$", "$\\alpha\\, S_{t-1}$", "corrected", "$S_t$")
    shapes = ("(d, e)", "every entry × α", "(I − β k kᵀ) α S", "+ β k vᵀ")
    keys = ("before", "decayed", "corrected", "after")
    grids = []
    for x, name, shape, k in zip(xs, names, shapes, keys):
        grids.append(
            draw.matrix(
                ax,
                (x, mid),
                3,
                2,
                cell=cell,
                values=st[k],
                name=name,
                shape=shape,
                gid=k,
                name_size=12,
                colour=draw.ROLE["weight"] if k == "after" else draw.ROLE["input"],
            )
        )
    moves = (f"1. decay\nα = {alpha}", f"2. correct\nβ = {beta}", "3. write")
    for a, b, text in zip(grids, grids[1:], moves):
        draw.arrow(ax, a.east, b.west, text=text)
    # the key, the value and the read, under the middle of the figure
    y = 0.62
    kb = draw.matrix(
        ax,
        (1.2, y),
        1,
        3,
        cell=0.36,
        values=key[None],
        colour=draw.ROLE["key"],
        gid="key",
    )
    draw.label(ax, (kb.left - 0.1, y), "k", ha="right", colour=draw.ROLE["key"])
    vb = draw.matrix(
        ax,
        (3.0, y),
        1,
        2,
        cell=0.36,
        values=value[None],
        colour=draw.ROLE["value"],
        gid="value",
    )
    draw.label(ax, (vb.left - 0.1, y), "v", ha="right", colour=draw.ROLE["value"])
    rb = draw.matrix(
        ax,
        (5.05, y),
        1,
        2,
        cell=0.36,
        values=st["read"][None],
        colour=draw.ROLE["query"],
        gid="read",
    )
    draw.label(
        ax,
        (rb.left - 0.1, y),
        "read r = (αS)ᵀk",
        ha="right",
        colour=draw.ROLE["query"],
    )
    draw.label(
        ax,
        (rb.right + 0.12, y),
        "replaced by v\nat step β",
        ha="left",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def channel_decay_example():
    """The log-decays of :func:`channel_decay`: ``(scalar, per_channel)``, ``(T, d)``.

    Six key channels over eight steps. Gated DeltaNet's gate is one number per step,
    the same for every channel (here :math:`\\alpha = 0.7`); KDA's is one per channel:
    channels 0-2 keep almost everything (:math:`\\alpha = 0.98`), channels 3-5 forget
    fast (:math:`\\alpha = 0.4`).
    """
    steps, d = 8, 6
    scalar = torch.full((steps, d), math.log(0.7), dtype=torch.float64)
    rates = torch.tensor([0.98] * 3 + [0.4] * 3, dtype=torch.float64)
    per_channel = rates.log().expand(steps, d).clone()
    return scalar, per_channel


def kept_per_channel(log_decay: torch.Tensor) -> torch.Tensor:
    """``(d, T)``: the share of a write at step 0 that key channel ``i`` still holds
    after step ``t``, read from :func:`~attention.kimi_delta_attention`'s state with
    nothing written (``beta = 0``) and an all-ones initial state."""
    steps, d = log_decay.shape
    kept = []
    for t in range(1, steps + 1):
        zeros = torch.zeros(1, 1, t, d, dtype=torch.float64)
        _, state = kimi_delta_attention(
            zeros,
            zeros,
            torch.zeros(1, 1, t, 1, dtype=torch.float64),
            log_decay[None, None, :t],
            torch.zeros(1, 1, t, dtype=torch.float64),
            initial_state=torch.ones(1, 1, d, 1, dtype=torch.float64),
            output_final_state=True,
        )
        kept.append(state[0, 0, :, 0])
    return torch.stack(kept, dim=1)


def channel_decay():
    """What each key channel of the state keeps over time: one gate, or one per channel.

    Each cell is the share of a write at step 0 that row ``i`` of the state (key
    channel ``i``) still holds after step ``t`` (``scalar[r,c]``, ``channel[r,c]``),
    computed by :func:`kept_per_channel`. Left, gated DeltaNet's one gate per step:
    every row fades alike. Right, KDA's gate per channel: three rows keep their
    content, three forget within a few steps.

    Returns:
        The Figure.
    """
    scalar, per_channel = channel_decay_example()
    left, right = kept_per_channel(scalar), kept_per_channel(per_channel)
    steps, d = scalar.shape
    fig, ax = draw.canvas(
        7.3, 3.45, "How much of a write each key channel keeps, step by step"
    )
    cell, mid = 0.3, 1.65
    rows = [f"channel {i}" for i in range(d)]
    cols = [str(t) for t in range(1, steps + 1)]
    a = draw.heatmap(
        ax,
        (2.05, mid),
        left,
        cell=cell,
        colorbar=None,
        fmt="{:.1f}",
        size=8,
        row_labels=rows,
        col_labels=cols,
        name="one gate per step (gated DeltaNet)",
        shape="α = 0.7 for every channel",
        gid="scalar",
    )
    b = draw.heatmap(
        ax,
        (5.35, mid),
        right,
        cell=cell,
        colorbar="share kept",
        fmt="{:.1f}",
        size=8,
        col_labels=cols,
        name="one gate per channel (KDA)",
        shape="α = 0.98 for channels 0-2, 0.4 for 3-5",
        gid="channel",
    )
    draw.label(
        ax,
        ((a.left + b.right) / 2, a.bottom - 0.42),
        "columns: steps t after the write",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def qwen3_next_sizes() -> dict[str, tuple[int, ...]]:
    """The weight shapes of :class:`~attention.GatedDeltaNet` at Qwen3-Next-80B-A3B's
    published sizes (hidden 2048; 16 query/key heads of 128; 32 value heads of 128;
    convolution width 4), built in bfloat16 (about 67 MB, freed on return; the ``meta``
    device would allocate nothing but takes seconds to load on first use)."""
    layer = GatedDeltaNet(
        2048,
        16,
        128,
        num_value_heads=32,
        value_head_dim=128,
        conv_size=4,
        dtype=torch.bfloat16,
    )
    return {
        name: tuple(p.shape)
        for name, p in layer.named_parameters()
        if name
        in (
            "w_query.weight",
            "w_value.weight",
            "w_beta.weight",
            "conv.weight",
            "log_decay_rate",
            "w_out.weight",
        )
    }


def qwen3_next_layer():
    """Qwen3-Next's Gated DeltaNet layer as a data flow, in the order of its code.

    Top lane, the memory's inputs and output: projections, short causal convolution
    and SiLU, unit queries and keys, the gated delta rule, a gated RMSNorm, the output
    projection. Bottom lane, what steers it: the step size :math:`\\beta`, the decay
    :math:`g` and the output gate :math:`z`, each a projection of the same input. The
    sizes printed (``size:<name>``) are the shapes of
    :class:`~attention.GatedDeltaNet`'s weights built at Qwen3-Next-80B-A3B's sizes
    (:func:`qwen3_next_sizes`).

    Returns:
        The Figure.
    """
    sizes = qwen3_next_sizes()
    fig, ax = draw.canvas(7.3, 3.6, "Qwen3-Next's Gated DeltaNet layer, step by step")
    top, low, bus = 2.45, 1.3, 0.62
    h = 0.62

    def step(x, y, text, width, colour=draw.INK):
        return draw.box(ax, (x, y), text, width=width, height=h, colour=colour, size=9)

    x_in = draw.box(ax, (0.42, top), "x", width=0.42, height=0.42)
    proj = step(1.45, top, "1. project\nq, k, v", 1.0)
    conv = step(2.7, top, "2. causal conv\nwidth 4, SiLU", 1.15)
    norm = step(3.95, top, "3. L2-normalise\nq and k", 1.17)
    rule = step(5.05, top, "5. gated\ndelta rule", 0.9, draw.ROLE["weight"])
    gate = step(6.35, top, "6. RMSNorm\n× SiLU(z), W_O", 1.15)
    beta = step(3.0, low, "4. β = σ(W_β x)", 1.35)
    decay = step(5.05, low, "4. g = −e^A_log ×\nsoftplus(W_Δ x + b)", 1.85)
    zbox = step(6.7, low, "z = W_Z x", 0.9)
    draw.arrow(ax, x_in.east, proj.west)
    for a, b in ((proj, conv), (conv, norm), (norm, rule), (rule, gate)):
        draw.arrow(ax, a.east, b.west)
    draw.arrow(ax, beta.north, (rule.left + 0.1, rule.bottom))
    draw.arrow(ax, decay.north, rule.south)
    draw.arrow(ax, zbox.north, (gate.right - 0.3, gate.bottom))
    # x also feeds the three projections of the lower lane
    ax.plot(
        [x_in.centre[0], x_in.centre[0], zbox.centre[0]],
        [x_in.bottom, bus, bus],
        color=draw.INK,
        lw=1.4,
        solid_capstyle="round",
    )
    for box in (beta, decay, zbox):
        draw.arrow(ax, (box.centre[0], bus), box.south)
    notes = (
        (proj, "w_query.weight", "W_Q: {1} → {0}"),
        (conv, "conv.weight", "{0} channels"),
        (rule, "log_decay_rate", "{0} value heads"),
        (gate, "w_out.weight", "W_O: {1} → {0}"),
    )
    for box, name, fmt in notes:
        text = draw.label(
            ax,
            (box.centre[0], box.top + 0.08),
            fmt.format(*sizes[name]),
            size=draw.SMALL,
            colour=draw.MUTED,
            va="bottom",
        )
        text.set_gid(f"size:{name}")
    draw.label(
        ax,
        (1.45, (low + bus) / 2 + 0.05),
        "one β and one g\nper value head\nand token",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig
