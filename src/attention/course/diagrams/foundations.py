"""Diagrams of the Foundations part (chapters 1-4): projections, weights, masks.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every number and shape printed in a
diagram is computed by the package on a tiny seeded example (``attention_weights``,
``scaled_dot_product_attention``, the mask builders, ``torch.broadcast_shapes``), so
the picture cannot drift from the mechanism it shows; each such text carries a ``gid``
naming what it shows (``weights[r,c]``, ``shape:padding`` ...) for the tests.

Shape legend: ``n`` tokens, ``d_model`` embedding size, ``d`` query/key size, ``e``
value size, ``i`` queries, ``j`` keys, ``B`` batch, ``H`` heads, ``Lq``/``Lk`` query
and key lengths. Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from ..._core import default_scale
from ...foundations.masks import causal_mask, decoding_mask, padding_mask
from ...foundations.scaled_dot_product import (
    attention_weights,
    scaled_dot_product_attention,
)
from ...foundations.softmax import softmax
from ...layers.scoring import dot_scores, scaled_dot_scores
from . import _draw as draw

__all__ = [
    "alignment_vectors",
    "vector_alignment",
    "score_matrix",
    "softmax_steps",
    "max_shift",
    "dot_product_variance",
    "scaling_rows",
    "qkv_projection",
    "scores_to_output",
    "mask_broadcast",
    "causal_triangle",
    "cache_mask",
]

_TOKENS = ("the", "cat", "sat", "down")


def _shape(size: torch.Size) -> str:
    return "(" + ", ".join(str(n) for n in size) + ")"


def qkv_projection():
    """X becomes Q, K and V: three learned projections of the same token vectors.

    The input ``X`` ``(n, d_model)`` holds one row per token; ``W_Q``, ``W_K``
    ``(d_model, d)`` and ``W_V`` ``(d_model, e)`` map every row to a query, a key and a
    value. The grids have the sizes of a tiny example computed with torch
    (``n = 4, d_model = 5, d = 3, e = 2``), so their cells match the shapes written.

    Returns:
        The Figure.
    """
    n, d_model, d, e = len(_TOKENS), 5, 3, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d_model, generator=g)
    projections = {
        "Q": torch.randn(d_model, d, generator=g),
        "K": torch.randn(d_model, d, generator=g),
        "V": torch.randn(d_model, e, generator=g),
    }
    roles = {"Q": "query", "K": "key", "V": "value"}
    sizes = {"Q": "d", "K": "d", "V": "e"}
    notes = {
        "Q": "queries: what each\ntoken is looking for",
        "K": "keys: what each token\ncan be found by",
        "V": "values: what each\ntoken passes on",
    }
    fig, ax = draw.canvas(7.2, 4.7, "Queries, keys and values: three projections of X")
    cell = 0.2
    xb = draw.matrix(
        ax,
        (1.15, 2.2),
        *x.shape,
        cell=cell,
        name="$X$",
        name_size=12,
        shape="(n, d_model)",
        row_labels=_TOKENS,
        gid="X",
    )
    draw.label(
        ax,
        (xb.centre[0], xb.bottom - 0.4),
        "one row per token",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    for row, (key, w) in zip((3.55, 2.2, 0.85), projections.items()):
        colour = draw.ROLE[roles[key]]
        out = x @ w  # (n, d) or (n, e): the grid has the result's shape
        wb = draw.matrix(
            ax,
            (3.2, row),
            *w.shape,
            cell=0.16,
            name=f"$W_{key}$",
            name_size=12,
            shape=f"(d_model, {sizes[key]})",
            colour=colour,
            gid=f"W_{key}",
        )
        ob = draw.matrix(
            ax,
            (4.85, row),
            *out.shape,
            cell=cell,
            name=f"${key}$",
            name_size=12,
            shape=f"(n, {sizes[key]})",
            colour=colour,
            gid=key,
        )
        draw.arrow(ax, xb.east, wb.west, colour=colour)
        draw.arrow(ax, wb.east, ob.west, text=f"$X W_{key}$", colour=colour, size=12)
        draw.label(ax, (5.55, row), notes[key], size=draw.SMALL, ha="left")
    return fig


def tiny_example():
    """The three tokens and their float64 queries, keys and values ``(3, 2)`` of
    :func:`scores_to_output`, seeded."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 2, generator=g, dtype=torch.float64) for _ in range(3))
    return ("cats", "chase", "mice"), q, k, v


def scores_to_output():
    """Scores become weights row by row; each output row is a weighted sum of values.

    Three tokens attend to each other (``d = e = 2``). The scores
    ``S = Q K^T / sqrt(d)`` (``scaled_dot_scores``), the weights ``A = softmax(S)`` row
    by row (``attention_weights``) and the output ``O = A V``
    (``scaled_dot_product_attention``) are the package's own results; the row of one
    query is outlined in all three and its output written out as a weighted sum.

    Returns:
        The Figure.
    """
    tokens, q, k, v = tiny_example()
    scores = scaled_dot_scores(q, k)  # (i, j)
    weights = attention_weights(q, k)  # (i, j)
    out = scaled_dot_product_attention(q, k, v)  # (i, e)
    focus = 1  # the query whose row is followed through

    fig, ax = draw.canvas(
        7.2, 3.3, "From scores to weights to a weighted sum of values"
    )
    cell, mid = 0.38, 1.75
    sb = draw.matrix(
        ax,
        (1.2, mid),
        3,
        3,
        cell=cell,
        values=scores,
        name="scores S",
        shape="S = Q Kᵀ / √d   (i, j)",
        row_labels=tokens,
        col_labels=tokens,
        gid="scores",
    )
    ab = draw.heatmap(
        ax,
        (3.07, mid),
        weights,
        cell=cell,
        name="weights A",
        shape="softmax of each row",
        col_labels=tokens,
        gid="weights",
    )
    draw.arrow(ax, sb.east, ab.west, text="softmax\nper row")
    vb = draw.matrix(
        ax,
        (5.05, mid),
        3,
        2,
        cell=cell,
        values=v,
        name="values V",
        shape="(j, e)",
        gid="values",
        colour=draw.ROLE["value"],
    )
    ob = draw.matrix(
        ax,
        (6.3, mid),
        3,
        2,
        cell=cell,
        values=out,
        name="output O",
        shape="O = A V   (i, e)",
        gid="output",
        colour=draw.ROLE["query"],
    )
    draw.label(ax, (vb.left - 0.22, mid), "×", size=14)
    draw.label(ax, ((vb.right + ob.left) / 2, mid), "=", size=14)
    for b in (sb, ab, ob):  # the followed query's row, in every matrix
        draw.outline(ax, draw.row(b, focus, cell))
    terms = " + ".join(
        f"{float(weights[focus, j]):.2f}·v({tokens[j]})" for j in range(3)
    )
    line = draw.label(ax, (3.6, 0.5), f"o({tokens[focus]}) = {terms}")
    line.set_gid("sum")
    draw.label(
        ax,
        (3.6, 0.24),
        "each row of weights sums to 1, so each output row is "
        "an average of the value rows",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def mask_broadcast():
    """A padding mask and a causal mask broadcast to the scores' shape (B, H, Lq, Lk).

    The padding mask ``(B, 1, 1, Lk)`` (``padding_mask``: the second sequence has two
    real tokens) hides the padded keys from every query of every head; the causal mask
    ``(1, 1, Lq, Lk)`` (``causal_mask``) hides the future from every sequence. Their
    AND, broadcast against the scores, is one ``(Lq, Lk)`` mask per sequence and head;
    the shapes written are computed with ``torch.broadcast_shapes``. Dark cells are
    True (may attend), light ones False (blocked).

    Returns:
        The Figure.
    """
    batch, heads, length = 2, 2, 4
    pad = padding_mask([length, 2], length)  # (B, 1, 1, Lk)
    causal = causal_mask(length)[None, None]  # (1, 1, Lq, Lk)
    scores = (batch, heads, length, length)
    full = torch.broadcast_shapes(pad.shape, causal.shape, scores)
    combined = (pad & causal).expand(full)  # (B, H, Lq, Lk)

    def fills(m):
        return [
            [draw.MAY_ATTEND if bool(a) else draw.BLOCKED for a in row] for row in m
        ]

    def shape(xy, symbols, size, gid):
        text = draw.label(
            ax,
            xy,
            f"{symbols} = {_shape(size)}",
            size=draw.SMALL,
            colour=draw.MUTED,
            va="top",
        )
        text.set_gid(gid)

    fig, ax = draw.canvas(
        7.2, 4.1, "Masks broadcast to the scores' shape (B, H, Lq, Lk)"
    )
    cell, left_x = 0.2, 1.35
    draw.label(ax, (left_x, 3.35), "padding mask", va="bottom", fontweight="bold")
    for b in range(batch):
        strip = draw.matrix(
            ax,
            (left_x, 3.1 - 0.4 * b),
            1,
            length,
            cell=cell,
            fills=fills(pad[b, 0]),
            colour=draw.INK,
            gid=f"pad{b}",
        )
        draw.label(
            ax,
            (strip.left - 0.1, strip.centre[1]),
            f"b = {b}",
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="right",
        )
    shape((left_x, 2.48), "(B, 1, 1, Lk)", pad.shape, "shape:padding")
    draw.label(ax, (left_x, 1.95), "AND", size=draw.SMALL, fontweight="bold")
    cb = draw.matrix(
        ax,
        (left_x, 1.0),
        length,
        length,
        cell=cell,
        colour=draw.INK,
        fills=fills(causal[0, 0]),
        name="causal mask",
        gid="causal",
    )
    shape((left_x, cb.bottom - 0.07), "(1, 1, Lq, Lk)", causal.shape, "shape:causal")

    panels = []
    for b in range(batch):
        for h in range(heads):
            centre = (4.45 + 1.3 * h, 2.55 - 1.35 * b)
            pb = draw.matrix(
                ax,
                centre,
                length,
                length,
                cell=cell,
                colour=draw.INK,
                fills=fills(combined[b, h]),
                gid=f"mask[{b},{h}]",
            )
            draw.label(
                ax,
                (pb.centre[0], pb.top + 0.06),
                f"b = {b}, h = {h}",
                size=draw.SMALL,
                colour=draw.MUTED,
                va="bottom",
            )
            panels.append(pb)
    left = min(p.left for p in panels)
    middle = (left + max(p.right for p in panels)) / 2
    draw.arrow(ax, (2.35, 1.95), (left - 0.3, 1.95), text="broadcast")
    draw.label(
        ax,
        (middle, 3.35),
        "one (Lq, Lk) mask per sequence b and head h",
        va="bottom",
        fontweight="bold",
    )
    shape((middle, panels[-1].bottom - 0.1), "(B, H, Lq, Lk)", full, "shape:broadcast")
    draw.label(
        ax,
        (middle, panels[-1].bottom - 0.34),
        "size-1 axes repeat: the same mask for every head",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    draw.legend(
        ax,
        (2.45, 1.2),
        [(draw.MAY_ATTEND, "True: may attend"), (draw.BLOCKED, "False: blocked")],
    )
    return fig


# --------------------------------------------------------------------------- chapter 1


def alignment_vectors() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The query and the three keys of :func:`vector_alignment`, ``(2,)`` each."""
    q = torch.tensor([1.0, 0.6])
    return {
        "aligned": (q, torch.tensor([1.5, 0.9])),  # 1.5 q: the same direction
        "orthogonal": (q, torch.tensor([-0.6, 1.0])),  # q rotated by 90 degrees
        "opposite": (q, torch.tensor([-1.0, -0.6])),  # -q
    }


def vector_alignment():
    """Aligned, orthogonal and opposite vectors, and the sign of their dot product.

    One query ``q`` and three keys: ``1.5 q`` (aligned, angle 0), ``q`` turned by a
    right angle (orthogonal) and ``-q`` (opposite). Under each pair its score
    ``q . k``, computed with ``dot_scores``: positive, zero, negative.

    Returns:
        The Figure.
    """
    from matplotlib.patches import Arc, Rectangle

    pairs = alignment_vectors()
    notes = {
        "aligned": ("angle 0°", "positive: k matches q"),
        "orthogonal": ("angle 90°", "zero: k is unrelated to q"),
        "opposite": ("angle 180°", "negative: k points away"),
    }
    fig, ax = draw.canvas(
        7.2, 3.3, "A score is a dot product: its sign follows the angle"
    )
    unit = 0.62  # inches per unit of length
    for column, (name, (q, k)) in enumerate(pairs.items()):
        ox, oy = 1.25 + 2.35 * column, 1.75
        for end in ((-1.05, 0), (1.05, 0), (0, -0.75), (0, 0.95)):  # faint axes
            ax.plot(
                [ox, ox + end[0]], [oy, oy + end[1]], color=draw.GRID, lw=0.6, zorder=-1
            )
        angle = float(torch.atan2(q[1], q[0]))
        if name == "orthogonal":  # a right-angle mark at the origin
            corner = Rectangle(
                (ox, oy),
                0.12,
                0.12,
                angle=math.degrees(angle),
                fill=False,
                edgecolor=draw.MUTED,
                lw=1.0,
            )
            ax.add_patch(corner)
        if name == "opposite":  # the half-turn between the two arrows
            ax.add_patch(
                Arc(
                    (ox, oy),
                    0.5,
                    0.5,
                    theta1=math.degrees(angle),
                    theta2=math.degrees(angle) + 180,
                    color=draw.MUTED,
                    lw=1.0,
                )
            )
        for vec, role, side in ((k, "key", -1), (q, "query", 1)):
            tip = (ox + unit * float(vec[0]), oy + unit * float(vec[1]))
            draw.arrow(ax, (ox, oy), tip, colour=draw.ROLE[role])
            # the letter beside the arrow's tip, off its line
            own = float(torch.atan2(vec[1], vec[0]))
            normal = (-math.sin(own) * side * 0.16, math.cos(own) * side * 0.16)
            draw.label(
                ax,
                (tip[0] + normal[0], tip[1] + normal[1]),
                "q" if role == "query" else "k",
                colour=draw.ROLE[role],
                fontweight="bold",
                size=11,
            )
        score = float(dot_scores(q[None], k[None])[0, 0])
        draw.label(ax, (ox, 0.82), f"{name} ({notes[name][0]})", fontweight="bold")
        text = draw.label(
            ax, (ox, 0.52), f"q · k = {score:+.2f}" if score else "q · k = 0"
        )
        text.set_gid(f"score:{name}")
        draw.label(ax, (ox, 0.26), notes[name][1], size=draw.SMALL, colour=draw.MUTED)
    return fig


def score_matrix_example() -> tuple[torch.Tensor, torch.Tensor]:
    """The small whole-number ``Q`` ``(3, 4)`` and ``K`` ``(5, 4)`` of
    :func:`score_matrix`, seeded."""
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-2, 3, (3, 4), generator=g).double()
    k = torch.randint(-2, 3, (5, 4), generator=g).double()
    return q, k


def score_matrix(i: int = 1, j: int = 3):
    """``Q K^T`` is the grid of every query-key dot product.

    ``Q`` ``(n, d) = (3, 4)`` holds one query per row, ``K^T`` ``(d, m) = (4, 5)`` one
    key per column, and entry ``(i, j)`` of ``S = Q K^T`` (``dot_scores``) is the dot
    product of row ``i`` of ``Q`` with column ``j`` of ``K^T``: the three are outlined,
    and the sum of products is written out. Whole numbers keep the sum readable.

    Args:
        i: the query whose score is followed.
        j: the key.

    Returns:
        The Figure.
    """
    q, k = score_matrix_example()
    scores = dot_scores(q, k)  # (n, m)
    n, d = q.shape
    m = k.shape[0]
    fig, ax = draw.canvas(7.2, 3.5, "Q Kᵀ: every query against every key at once")
    cell, mid = 0.32, 1.95
    qb = draw.matrix(
        ax,
        (1.2, mid),
        n,
        d,
        cell=cell,
        values=q,
        fmt="{:.0f}",
        name="Q",
        shape=f"(n, d) = ({n}, {d})",
        row_labels=[f"q{r}" for r in range(n)],
        colour=draw.ROLE["query"],
        gid="Q",
    )
    kb = draw.matrix(
        ax,
        (3.35, mid),
        d,
        m,
        cell=cell,
        values=k.T,
        fmt="{:.0f}",
        name="Kᵀ",
        shape=f"(d, m) = ({d}, {m})",
        col_labels=[f"k{c}" for c in range(m)],
        colour=draw.ROLE["key"],
        gid="KT",
    )
    sb = draw.matrix(
        ax,
        (5.85, mid),
        n,
        m,
        cell=cell,
        values=scores,
        fmt="{:.0f}",
        name="S = Q Kᵀ",
        shape=f"(n, m) = ({n}, {m})",
        row_labels=[f"q{r}" for r in range(n)],
        col_labels=[f"k{c}" for c in range(m)],
        colour=draw.ROLE["weight"],
        gid="S",
    )
    draw.label(ax, ((qb.right + kb.left) / 2, mid), "×", size=14)
    draw.label(ax, ((kb.right + sb.left) / 2 - 0.1, mid), "=", size=14)
    draw.outline(ax, draw.row(qb, i, cell), colour=draw.ROLE["query"])
    column = draw.Bounds(kb.left + j * cell, kb.bottom, cell, kb.height)
    draw.outline(ax, column, colour=draw.ROLE["key"])
    entry = draw.Bounds(sb.left + j * cell, sb.top - (i + 1) * cell, cell, cell)
    draw.outline(ax, entry)

    def number(x: float | torch.Tensor) -> str:
        return f"{x:.0f}" if x >= 0 else f"({x:.0f})"

    terms = " + ".join(f"{number(a)}·{number(b)}" for a, b in zip(q[i], k[j]))
    line = draw.label(
        ax, (3.6, 0.55), f"S[{i},{j}] = q{i} · k{j} = {terms} = {scores[i, j]:.0f}"
    )
    line.set_gid("sum")
    draw.label(
        ax,
        (3.6, 0.27),
        "row i of S: query i against every key;  column j: every query against key j",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


# --------------------------------------------------------------------------- chapter 2

#: The scores of :func:`softmax_steps`.
SOFTMAX_SCORES = (1.0, 3.0, 0.5, 2.0)
#: The scores of :func:`max_shift`, large enough that ``exp`` overflows in float32.
LARGE_SCORES = (1000.0, 1001.0, 1002.0)


def softmax_steps():
    """Softmax in three steps: exponentiate, add up, divide.

    A row of four scores (:data:`SOFTMAX_SCORES`) becomes ``exp`` of each score
    (positive, gaps magnified), their sum, and the weights ``exp(z) / sum``, which the
    package's ``softmax`` gives too; the weights are drawn on the weight colour scale.

    Returns:
        The Figure.
    """
    z = torch.tensor(SOFTMAX_SCORES, dtype=torch.float64)[None]  # (1, n)
    e = torch.exp(z)  # (1, n)
    total = e.sum()
    weights = softmax(z)  # (1, n)
    n = z.shape[-1]
    fig, ax = draw.canvas(
        7.2, 3.9, "Softmax in three steps: exponentiate, add up, divide"
    )
    cell, x = 0.62, 3.1
    rows = (3.0, 1.85, 0.7)
    zb = draw.matrix(
        ax,
        (x, rows[0]),
        1,
        n,
        cell=cell,
        values=z,
        name=None,
        gid="z",
        size=10,
        colour=draw.ROLE["input"],
    )
    eb = draw.matrix(
        ax,
        (x, rows[1]),
        1,
        n,
        cell=cell,
        values=e,
        gid="exp",
        size=10,
        colour=draw.ROLE["key"],
    )
    wb = draw.heatmap(
        ax,
        (x, rows[2]),
        weights,
        cell=cell,
        gid="weights",
        size=10,
    )
    for b, text in (
        (zb, "scores z"),
        (eb, "exp(z)"),
        (wb, "weights\nexp(z) / sum"),
    ):
        draw.label(ax, (b.left - 0.2, b.centre[1]), text, ha="right", fontweight="bold")
    draw.arrow(
        ax, zb.south, eb.north, text="exp: positive, gaps magnified", side="right"
    )
    draw.arrow(ax, eb.south, wb.north, text="÷ sum", side="right")
    draw.brace(
        ax, (eb.right + 0.08, eb.top), (eb.right + 0.08, eb.bottom), side="right"
    )
    sum_text = draw.label(
        ax, (eb.right + 0.38, eb.centre[1]), f"sum = {float(total):.2f}", ha="left"
    )
    sum_text.set_gid("sum")
    draw.label(
        ax,
        (wb.right + 0.75, wb.centre[1]),
        "positive,\nsum to 1",
        ha="left",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def max_shift():
    """Subtracting the maximum: the same weights, and no overflow.

    Scores near 1000 (:data:`LARGE_SCORES`) in float32: ``exp`` overflows to ``inf``
    and ``inf / inf`` is NaN. Subtracting the row's maximum first gives scores ``<= 0``,
    whose ``exp`` lies in ``(0, 1]``, a sum in ``[1, n]``, and the weights that
    ``softmax`` (the package's, float64) gives the original scores. All numbers are
    computed in the function.

    Returns:
        The Figure.
    """
    z = torch.tensor(LARGE_SCORES, dtype=torch.float32)[None]  # (1, n)
    naive_exp = torch.exp(z)  # inf
    naive = naive_exp / naive_exp.sum()  # nan
    shifted = z - z.max()
    shifted_exp = torch.exp(shifted)
    weights = shifted_exp / shifted_exp.sum()
    reference = softmax(z.double())  # the float64 answer
    n = z.shape[-1]
    fig, ax = draw.canvas(7.2, 3.5, "The max shift: the same weights, without overflow")
    cell = 0.56
    bad, good = draw.tint("#c0392b", 0.9), draw.ROLE["value"]
    top, bottom = 2.45, 0.95
    cols = (1.55, 3.55, 5.6)
    specs = [
        (top, [z, naive_exp, naive], ["scores z", "exp(z)", "exp(z) / sum"], bad),
        (
            bottom,
            [shifted, shifted_exp, weights],
            ["z - max z", "exp(z - max z)", "exp(...) / sum"],
            good,
        ),
    ]
    gids = (
        ("naive:z", "naive:exp", "naive:weights"),
        ("shift:z", "shift:exp", "shift:weights"),
    )
    fmts = ("{:.0f}", "{:.2f}", "{:.2f}")
    for (y, mats, names, colour), ids in zip(specs, gids):
        boxes = []
        for x, mat, name, gid, fmt in zip(cols, mats, names, ids, fmts):
            box = draw.matrix(
                ax,
                (x, y),
                1,
                n,
                cell=cell,
                values=mat,
                fmt=fmt,
                name=name,
                colour=colour,
                gid=gid,
                size=9,
            )
            boxes.append(box)
        draw.arrow(ax, boxes[0].east, boxes[1].west, colour=colour)
        draw.arrow(ax, boxes[1].east, boxes[2].west, colour=colour)
    draw.label(ax, (0.3, top), "naive", rotation=90, fontweight="bold", colour=bad)
    draw.label(
        ax, (0.3, bottom), "shifted", rotation=90, fontweight="bold", colour=good
    )
    draw.label(
        ax,
        (3.6, top - 0.55),
        "float32 overflows above e^88.7: inf / inf is NaN",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    note = draw.label(
        ax,
        (3.6, bottom - 0.55),
        "every exponent <= 0, the largest term is 1: the same weights as "
        + "softmax(z) in float64: "
        + ", ".join(f"{float(w):.2f}" for w in reference[0]),
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    note.set_gid("reference")
    return fig


# --------------------------------------------------------------------------- chapter 3

#: The head sizes of :func:`dot_product_variance`'s table and :func:`scaling_rows`.
SCALING_DIMS = (4, 64, 1024)


def variance_table(dims=SCALING_DIMS, pairs: int = 4000, seed: int = 0):
    """``{d_k: (Var(q . k), Var(q . k / sqrt(d_k)))}`` over ``pairs`` seeded random
    pairs with independent standard normal entries (float64)."""
    g = torch.Generator().manual_seed(seed)
    table = {}
    for d in dims:
        q = torch.randn(pairs, d, generator=g, dtype=torch.float64)
        k = torch.randn(pairs, d, generator=g, dtype=torch.float64)
        dots = dot_scores(q[:, None], k[:, None])[:, 0, 0]  # (pairs,)
        table[d] = (float(dots.var()), float((dots * default_scale(None, d)).var()))
    return table


def variance_example() -> tuple[torch.Tensor, torch.Tensor]:
    """The seeded query and key ``(1, 8)`` of :func:`dot_product_variance`."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, generator=g, dtype=torch.float64)
    return q, torch.randn(1, 8, generator=g, dtype=torch.float64)


def dot_product_variance():
    """Why ``q . k`` spreads like ``sqrt(d_k)``, and what dividing by it does.

    A query and a key of ``d_k = 8`` seeded standard normal entries, their products
    ``q_l k_l`` and the sum ``q . k``. Each product has mean 0 and variance 1, so the
    sum of ``d_k`` independent ones has variance ``d_k``; dividing by ``sqrt(d_k)``
    brings it back to 1. The table measures both variances over 4,000 random pairs
    for ``d_k`` = 4, 64 and 1024 (:func:`variance_table`).

    Returns:
        The Figure.
    """
    q, k = variance_example()
    d = q.shape[-1]
    products = q * k
    score = float(dot_scores(q, k)[0, 0])
    fig, ax = draw.canvas(
        7.2, 3.6, "Why q · k spreads like √dₖ, and what the scale does"
    )
    cell, x = 0.4, 2.6
    rows = (2.7, 2.1, 1.35)
    qb, kb, pb = (
        draw.matrix(
            ax,
            (x, y),
            1,
            d,
            cell=cell,
            values=values,
            fmt="{:.1f}",
            gid=gid,
            colour=draw.ROLE[role],
            size=8.5,
        )
        for y, values, gid, role in zip(
            rows, (q, k, products), ("q", "k", "qk"), ("query", "key", "weight")
        )
    )
    for b, text, role in (
        (qb, "q", "query"),
        (kb, "k", "key"),
        (pb, "products", "weight"),
    ):
        draw.label(
            ax,
            (b.left - 0.15, b.centre[1]),
            text,
            ha="right",
            fontweight="bold",
            colour=draw.ROLE[role],
        )
    draw.brace(ax, (pb.left, pb.bottom - 0.05), (pb.right, pb.bottom - 0.05))
    total = draw.label(
        ax, (pb.centre[0], pb.bottom - 0.32), f"sum: q · k = {score:.2f}", va="top"
    )
    total.set_gid("score")
    draw.label(
        ax,
        (pb.centre[0], 0.38),
        "dₖ products, each of mean 0 and variance 1: Var(q · k) = dₖ",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    # the measured variances
    table = variance_table()
    left, top = 4.8, 2.85
    headers = ("dₖ", "Var(q · k)", "after ÷ √dₖ")
    columns = (left, left + 0.7, left + 1.6)
    for cx, text in zip(columns, headers):
        draw.label(ax, (cx, top), text, size=draw.SMALL, fontweight="bold")
    for r, (dk, (raw, scaled)) in enumerate(table.items()):
        y = top - 0.42 * (r + 1)
        draw.label(ax, (columns[0], y), f"{dk}")
        draw.label(ax, (columns[1], y), f"{raw:.1f}").set_gid(f"var:{dk}")
        draw.label(ax, (columns[2], y), f"{scaled:.2f}").set_gid(f"scaled:{dk}")
    draw.label(
        ax,
        ((columns[0] + columns[2]) / 2, top - 0.42 * 4 - 0.05),
        "measured over 4,000 random pairs",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


def scaling_rows_example(d: int, n: int = 8, seed: int = 0):
    """The seeded query ``(1, d)`` and keys ``(n, d)`` of one row of
    :func:`scaling_rows`."""
    g = torch.Generator().manual_seed(seed + d)
    q = torch.randn(1, d, generator=g, dtype=torch.float64)
    k = torch.randn(n, d, generator=g, dtype=torch.float64)
    return q, k


def scaling_rows():
    """One row of weights per ``d_k``, without and with the ``1/sqrt(d_k)`` scale.

    For ``d_k`` = 4, 64 and 1024 a seeded query meets 8 seeded keys (standard normal
    entries). Without the scale (``attention_weights(..., scale=1)``) the scores spread
    like ``sqrt(d_k)`` and the row turns one-hot; with it (the default scale) every
    ``d_k`` gives scores of the same spread and a row with several keys in play. The
    range of each row's scores is written under it.

    Returns:
        The Figure.
    """
    fig, ax = draw.canvas(
        7.2, 3.9, "Without the scale, a row turns one-hot as dₖ grows"
    )
    cell = 0.3
    columns = {"no scale: softmax(q · k)": 2.3, "softmax(q · k / √dₖ)": 4.95}
    for name, cx in columns.items():
        draw.label(ax, (cx, 3.3), name, fontweight="bold")
    for r, d in enumerate(SCALING_DIMS):
        y = 2.6 - 0.95 * r
        q, k = scaling_rows_example(d)
        raw = dot_scores(q, k)  # (1, n)
        draw.label(ax, (0.55, y), f"dₖ = {d}", fontweight="bold")
        for cx, scale in zip(columns.values(), (1.0, None)):
            weights = attention_weights(q, k, scale=scale)  # (1, n)
            scores = raw if scale == 1.0 else raw * default_scale(None, d)
            tag = "raw" if scale == 1.0 else "scaled"
            bounds = draw.heatmap(
                ax, (cx, y), weights, cell=cell, gid=f"{tag}:{d}", size=8, colorbar=None
            )
            note = draw.label(
                ax,
                (cx, bounds.bottom - 0.07),
                f"scores from {float(scores.min()):.1f} to {float(scores.max()):.1f}",
                size=draw.SMALL,
                colour=draw.MUTED,
                va="top",
            )
            note.set_gid(f"range:{tag}:{d}")
    # one colour bar for all six rows: they share the scale [0, 1]
    cax = ax.inset_axes((6.45, 0.45, 0.1, 2.35), transform=ax.transData)
    bar = fig.colorbar(plt.cm.ScalarMappable(cmap=draw.WEIGHT_CMAP), cax=cax)
    bar.set_ticks([0, 0.5, 1])
    bar.ax.tick_params(labelsize=draw.SMALL, colors=draw.MUTED, length=2)
    bar.outline.set_edgecolor(draw.GRID)
    bar.set_label("weight", fontsize=draw.SMALL, color=draw.MUTED, labelpad=2)
    return fig


# --------------------------------------------------------------------------- chapter 4


def causal_example():
    """The four tokens and the float64 ``(4, 4)`` scores of :func:`causal_triangle`."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 2, generator=g, dtype=torch.float64)
    k = torch.randn(4, 2, generator=g, dtype=torch.float64)
    return _TOKENS, q, k


def causal_triangle():
    """The causal mask: scores above the diagonal become -inf, their weights 0.

    Four tokens attend to each other. The scores ``S = Q K^T / sqrt(d)``
    (``scaled_dot_scores``), the mask ``causal_mask(4)`` (True = may attend, on and
    below the diagonal), the masked scores with ``-inf`` where the mask is False, and
    the weights ``attention_weights(q, k, attn_mask=mask)``: each row spreads over the
    keys up to its own position, and the first token attends only to itself.

    Returns:
        The Figure.
    """
    tokens, q, k = causal_example()
    n = len(tokens)
    scores = scaled_dot_scores(q, k)  # (n, n)
    mask = causal_mask(n)  # (n, n), True = may attend
    weights = attention_weights(q, k, attn_mask=mask)  # (n, n)
    fig, ax = draw.canvas(7.2, 3.7, "The causal mask: no query sees a later key")
    cell, mid = 0.34, 1.85
    sb = draw.matrix(
        ax,
        (1.2, mid),
        n,
        n,
        cell=cell,
        values=scores,
        name="scores S",
        row_labels=tokens,
        col_labels=tokens,
        gid="scores",
        size=8,
    )
    fills = [
        [draw.tint(draw.ROLE["input"]) if bool(a) else draw.BLOCKED for a in row]
        for row in mask
    ]
    shown = torch.where(mask, scores, torch.full_like(scores, -math.inf))
    mb = draw.matrix(
        ax,
        (3.5, mid),
        n,
        n,
        cell=cell,
        values=shown,
        fills=fills,
        name="S, future set to -inf",
        col_labels=tokens,
        gid="masked",
        size=8,
    )
    wb = draw.heatmap(
        ax,
        (5.7, mid),
        weights,
        cell=cell,
        name="weights",
        col_labels=tokens,
        gid="weights",
        size=8,
    )
    draw.arrow(ax, sb.east, mb.west, text="mask")
    draw.arrow(ax, mb.east, wb.west, text="softmax\nper row")
    draw.label(
        ax,
        (3.6, 0.55),
        "row i keeps keys 0..i: causal_mask is True on and below the diagonal",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    draw.label(
        ax,
        (3.6, 0.3),
        "exp(-∞) = 0: blocked keys get weight exactly 0, and each row still sums to 1",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    return fig


#: Cached and new positions of :func:`cache_mask`.
CACHED, NEW = 5, 3


def cache_mask():
    """Decoding with a KV cache: the mask of the new queries, and the wrong one.

    After ``CACHED`` positions are cached, ``NEW`` queries arrive at absolute positions
    ``CACHED ..``. ``decoding_mask(NEW, CACHED)`` lets each see every cached key plus a
    causal triangle over the new ones: the last ``NEW`` rows of ``causal_mask`` over all
    positions. ``is_causal=True`` aligns the triangle top-left instead
    (``causal_mask(NEW, CACHED + NEW)``) and hides most of the cache. Dark cells are
    True (may attend).

    Returns:
        The Figure.
    """
    right = decoding_mask(NEW, CACHED)  # (NEW, CACHED + NEW)
    wrong = causal_mask(NEW, CACHED + NEW)  # top-left: what is_causal=True means
    total = CACHED + NEW

    def fills(m):
        return [
            [draw.MAY_ATTEND if bool(a) else draw.BLOCKED for a in row] for row in m
        ]

    fig, ax = draw.canvas(
        7.2, 3.7, f"Decoding {NEW} new tokens after {CACHED} cached ones"
    )
    cell = 0.28
    rows = [f"query {CACHED + r}" for r in range(NEW)]
    cols = [str(c) for c in range(total)]
    panels = (
        (1.95, right, "decoding_mask(3, 5): right", "right"),
        (5.35, wrong, "is_causal=True: wrong", "wrong"),
    )
    for x, m, title, gid in panels:
        b = draw.matrix(
            ax,
            (x, 2.05),
            NEW,
            total,
            cell=cell,
            fills=fills(m),
            colour=draw.INK,
            row_labels=rows,
            col_labels=cols,
            gid=gid,
            name=title,
        )
        cached_end = b.left + CACHED * cell
        draw.bracket(
            ax,
            (b.left, b.bottom - 0.06),
            (cached_end - 0.03, b.bottom - 0.06),
            "cached keys",
            side="below",
        )
        draw.bracket(
            ax,
            (cached_end + 0.03, b.bottom - 0.06),
            (b.right, b.bottom - 0.06),
            "new",
            side="below",
        )
    draw.label(
        ax,
        (3.6, 0.85),
        f"new query r sits at position {CACHED} + r: it may see all {CACHED} cached "
        "keys and new keys 0..r",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    draw.label(
        ax,
        (3.6, 0.58),
        "is_causal=True lets query r see keys 0..r only: most of the cache is hidden",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    draw.legend(
        ax,
        (2.0, 0.3),
        [(draw.MAY_ATTEND, "True: may attend")],
    )
    draw.legend(ax, (4.2, 0.3), [(draw.BLOCKED, "False: blocked")])
    return fig
