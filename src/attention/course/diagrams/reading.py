"""Diagrams of the last part (chapters 19-20): circuits of a head, beyond softmax.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every number and shape a diagram
prints is computed by the package on a tiny seeded example (``qk_circuit`` and
``ov_circuit`` of a ``MultiHeadAttention``, ``prefix_matching_score``, ``softmax``,
``sparsemax``, ``differential_attention``), so the picture cannot drift from the
mechanism it shows; each such text carries a ``gid`` naming what it shows
(``rank:qk``, ``key:induction``, ``sparsemax:a[0]`` ...) for the tests.

Shape legend: ``D`` model size, ``d`` head size, ``n`` positions, ``j`` keys. Mask
convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import Normalize
from matplotlib.patches import FancyArrowPatch, Polygon, Rectangle

from ...foundations.softmax import softmax
from ...layers.multihead import MultiHeadAttention
from ...reading.circuits import ov_circuit, prefix_matching_score, qk_circuit
from ...reading.weights import differential_attention, sparsemax
from . import _draw as draw

__all__ = [
    "head_circuits",
    "induction_circuit",
    "simplex_projections",
    "differential_maps",
]

_STREAM = draw.ROLE["input"]


def _curve(ax, start, end, *, rad: float, colour: str, style: str = "-|>", ls="-"):
    """A curved arrow from ``start`` to ``end`` (inches), bent by ``rad``."""
    patch = FancyArrowPatch(
        start,
        end,
        arrowstyle=style,
        mutation_scale=12,
        lw=1.5,
        color=colour,
        linestyle=ls,
        connectionstyle=f"arc3,rad={rad}",
        shrinkA=2,
        shrinkB=2,
    )
    ax.add_patch(patch)
    return patch


# ========================================================================== chapter 19


def circuit_example():
    """The tiny seeded head of :func:`head_circuits`: a bias-free
    ``MultiHeadAttention(8, 2)`` in float64, so ``D = 8`` and ``d = 4``.

    Returns:
        ``(layer, qk, ov)``: the module and its circuits ``(h, D, D)`` from
        :func:`~attention.qk_circuit` and :func:`~attention.ov_circuit`.
    """
    torch.manual_seed(19)
    layer = MultiHeadAttention(8, 2, bias=False, dtype=torch.float64)
    with torch.no_grad():
        return layer, qk_circuit(layer), ov_circuit(layer)


def head_circuits():
    r"""One head as two circuits on the residual stream.

    Two positions of the residual stream, a key ``j`` on the left and a query ``i`` on
    the right, run from the embeddings up to the unembedding. The head reads both
    through its QK circuit :math:`W_{QK} = W_Q W_K^\top` (a score for the pair: where
    to look), turns the scores into weights, and writes into position ``i`` what its
    OV circuit :math:`W_{OV} = W_V W_O` makes of ``x_j`` (what to move), scaled by the
    weight. The size and rank printed under each circuit (``shape:qk``, ``rank:qk``,
    ``shape:ov``, ``rank:ov``) are those of head 0 of :func:`circuit_example`.

    Returns:
        The Figure.
    """
    layer, qk, ov = circuit_example()
    big_d, d = qk.shape[-1], layer.head_dim
    rank_qk = int(torch.linalg.matrix_rank(qk[0]))
    rank_ov = int(torch.linalg.matrix_rank(ov[0]))

    fig, ax = draw.canvas(
        7.2, 3.75, "A head reads the stream through one circuit, writes through another"
    )
    bottom, top = 0.5, 2.95
    streams = {}
    for name, x, words in (
        ("key", 0.95, "position j (a key)"),
        ("query", 6.25, "position i (the query)"),
    ):
        ax.add_patch(
            Rectangle(
                (x - 0.2, bottom),
                0.4,
                top - bottom,
                facecolor=draw.tint(_STREAM, 0.3),
                edgecolor=_STREAM,
                lw=1.2,
            )
        )
        draw.arrow(ax, (x, top - 0.02), (x, top + 0.3), colour=_STREAM)
        draw.label(ax, (x, bottom - 0.08), words, size=draw.SMALL, va="top")
        streams[name] = x
    draw.label(
        ax,
        (streams["key"] + 0.32, top + 0.18),
        "residual stream",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    draw.label(
        ax,
        (streams["query"] - 0.32, top + 0.18),
        "residual stream",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="right",
    )
    left, right = streams["key"] + 0.2, streams["query"] - 0.2

    y_qk, y_w, y_ov = 2.45, 1.62, 0.82
    qk_box = draw.box(
        ax,
        (3.6, y_qk),
        "QK circuit  $W_{QK} = W_Q W_K^{\\top}$",
        colour=draw.ROLE["query"],
        size=12,
        width=2.9,
        height=0.46,
    )
    draw.arrow(
        ax, (left, y_qk), qk_box.west, text="$x_j$", colour=draw.ROLE["key"], size=12
    )
    draw.arrow(
        ax,
        (right, y_qk),
        qk_box.east,
        text="$x_i$",
        colour=draw.ROLE["query"],
        size=12,
    )
    note = draw.label(
        ax,
        (qk_box.centre[0], qk_box.top + 0.06),
        f"where to look: ({big_d}, {big_d}), rank {rank_qk} = d",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="bottom",
    )
    note.set_gid("rank:qk")

    w_box = draw.box(
        ax,
        (3.6, y_w),
        "softmax over the keys j:  weight $A_{ij}$",
        colour=draw.ROLE["weight"],
        size=12,
        width=3.3,
        height=0.42,
    )
    draw.arrow(ax, qk_box.south, w_box.north)
    draw.label(
        ax,
        (3.68, (qk_box.bottom + w_box.top) / 2),
        "score $x_i\\, W_{QK}\\, x_j^{\\top} / \\sqrt{d}$",
        size=12,
        colour=draw.MUTED,
        ha="left",
    )

    ov_box = draw.box(
        ax,
        (2.75, y_ov),
        "OV circuit  $W_{OV} = W_V W_O$",
        colour=draw.ROLE["value"],
        size=12,
        width=2.7,
        height=0.46,
    )
    draw.arrow(ax, (left, y_ov), ov_box.west, colour=draw.ROLE["value"])
    draw.arrow(ax, ov_box.east, (right, y_ov), colour=draw.ROLE["value"])
    draw.label(
        ax,
        ((ov_box.right + right) / 2 + 0.05, y_ov - 0.1),
        "adds $A_{ij}\\, x_j W_{OV}$",
        size=12,
        colour=draw.ROLE["value"],
        va="top",
    )
    note = draw.label(
        ax,
        (ov_box.centre[0], ov_box.bottom - 0.06),
        f"what to move: ({big_d}, {big_d}), rank {rank_ov} = d",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    note.set_gid("rank:ov")
    # the weight scales what the OV circuit writes
    x_gate = (ov_box.right + right) / 2 + 0.05
    draw.arrow(
        ax,
        (x_gate, w_box.bottom),
        (x_gate, y_ov + 0.04),
        colour=draw.ROLE["weight"],
    )
    size_note = draw.label(
        ax,
        (3.6, 0.2),
        f"D = {big_d} (model size), d = {d} (head size)",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    size_note.set_gid("sizes")
    return fig


#: The sequence of :func:`induction_circuit`: a name seen before comes back.
INDUCTION_TOKENS = ("Harry", "Potter", "went", "to", "school", ".", "Harry")


def induction_key(tokens=INDUCTION_TOKENS) -> int:
    """The key the last token's induction head attends to, by the package's rule.

    A one-hot map from the last query to each key in turn, scored by
    :func:`~attention.prefix_matching_score`: the key it credits is the position just
    after the earlier copy of the last token.
    """
    ids = {t: k for k, t in enumerate(dict.fromkeys(tokens))}
    t = torch.tensor([ids[w] for w in tokens])
    n = len(tokens)
    for j in range(n):
        w = torch.zeros(n, n, dtype=torch.float64)
        w[n - 1, j] = 1.0
        if prefix_matching_score(w, t).item() == 1.0:
            return j
    raise ValueError("the last token has no earlier copy")


def induction_circuit():
    """An induction head: a previous-token head feeds it through K-composition.

    The sequence "Harry Potter went to school . Harry": in layer 0 a previous-token
    head at position 1 attends to position 0 and writes "my previous token was Harry"
    into position 1. In layer 1 the induction head at the last position, whose token is
    "Harry", scores the keys by what layer 0 wrote into them (K-composition): key 1
    matches, so it attends there and its OV circuit copies "Potter", the prediction.
    The key drawn (``key:induction``) is the one :func:`induction_key` finds with
    :func:`~attention.prefix_matching_score`.

    Returns:
        The Figure.
    """
    tokens = INDUCTION_TOKENS
    n = len(tokens)
    j = induction_key(tokens)
    fig, ax = draw.canvas(
        7.4, 3.7, "An induction head: find the earlier copy, copy what came next"
    )
    step, x0 = 0.74, 1.3
    y_tok, y_l0, y_l1 = 0.62, 1.62, 2.72
    for y, words in ((y_tok, "tokens"), (y_l0, "layer 0"), (y_l1, "layer 1")):
        draw.label(ax, (0.18, y), words, size=draw.SMALL, colour=draw.MUTED, ha="left")
    boxes = []
    for k, word in enumerate(tokens):
        colour = draw.ROLE["query"] if k == n - 1 else _STREAM
        b = draw.box(ax, (x0 + k * step, y_tok), word, width=0.66, colour=colour)
        draw.label(
            ax,
            (b.centre[0], b.bottom - 0.05),
            str(k),
            size=draw.SMALL,
            colour=draw.MUTED,
            va="top",
        )
        boxes.append(b)
    prev, head_colour, copy = draw.ROLE["key"], draw.ROLE["query"], draw.ROLE["value"]
    # layer 0: the previous-token head at position j reads position j - 1
    tag = draw.box(
        ax,
        (boxes[j].centre[0], y_l0),
        f"previous: {tokens[j - 1]}",
        colour=prev,
        size=draw.SMALL,
    )
    _curve(ax, boxes[j - 1].north, (tag.left + 0.15, tag.bottom), rad=-0.3, colour=prev)
    draw.arrow(ax, boxes[j].north, (boxes[j].centre[0], tag.bottom), colour=_STREAM)
    draw.label(
        ax,
        (tag.right + 0.12, tag.centre[1]),
        f"previous-token head:\nposition {j} stores the token before it",
        size=draw.SMALL,
        colour=prev,
        ha="left",
    )
    # layer 1: the induction head at the last position reads key j
    head = draw.box(
        ax,
        (boxes[-1].centre[0], y_l1),
        f'induction head\nquery "{tokens[-1]}"',
        colour=head_colour,
        size=draw.SMALL,
    )
    draw.arrow(ax, boxes[-1].north, head.south, colour=_STREAM)
    arc = _curve(ax, (tag.centre[0], tag.top), head.west, rad=-0.12, colour=head_colour)
    arc.set_gid(f"key:induction[{j}]")
    match = draw.label(
        ax,
        (3.3, 2.92),
        f"key {j} matches: its previous token is {tokens[j - 1]}\n(K-composition)",
        size=draw.SMALL,
        colour=head_colour,
    )
    match.set_gid("key:induction")
    out = draw.box(ax, (6.85, y_tok), tokens[j], width=0.72, colour=copy)
    draw.label(
        ax,
        (out.centre[0], out.bottom - 0.05),
        "prediction",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    _curve(ax, head.east, out.north, rad=-0.35, colour=copy)
    draw.label(
        ax,
        (out.centre[0] - 0.12, (head.bottom + out.top) / 2),
        f"OV copies\n{tokens[j]}",
        size=draw.SMALL,
        colour=copy,
        ha="right",
    )
    return fig


# ========================================================================== chapter 20

#: The two score vectors of :func:`simplex_projections`: one whose sparsemax lands on
#: an edge of the simplex (one zero), one whose sparsemax is a corner (two zeros).
SIMPLEX_SCORES = {
    "a": (0.9, 0.6, -0.1),
    "b": (0.3, 1.6, 0.1),
}


def simplex_example() -> dict[str, dict[str, torch.Tensor]]:
    """The scores of :func:`simplex_projections` and what the maps make of them.

    Returns:
        ``{name: {"z": z, "plane": z moved onto the plane sum = 1, "softmax": ...,
        "sparsemax": ...}}`` in float64, the maps from the package.
    """
    found = {}
    for name, scores in SIMPLEX_SCORES.items():
        z = torch.tensor(scores, dtype=torch.float64)
        found[name] = {
            "z": z,
            "plane": z - (z.sum() - 1) / 3,
            "softmax": softmax(z),
            "sparsemax": sparsemax(z),
        }
    return found


def simplex_projections():
    """Softmax and sparsemax of three scores, drawn on the probability simplex.

    The triangle holds every distribution over three keys (its corners put all the
    weight on one key). Scores ``z`` moved onto the plane ``sum = 1`` (neither map sees
    the shift) lie outside it; sparsemax is the nearest point of the triangle, the
    orthogonal projection, so it lands on an edge (one key at exactly 0) or on a corner
    (two keys at 0). Softmax always lands inside: every key keeps some weight. The
    tables give the numbers (``softmax:a[k]``, ``sparsemax:a[k]`` ...).

    Returns:
        The Figure.
    """
    found = simplex_example()
    side, origin = 2.1, (1.25, 1.5)
    corners = torch.tensor(
        [
            [origin[0], origin[1]],
            [origin[0] + side, origin[1]],
            [origin[0] + side / 2, origin[1] + side * math.sqrt(3) / 2],
        ],
        dtype=torch.float64,
    )

    def at(p):
        """Inches of a point with barycentric coordinates ``p`` (summing to one)."""
        return tuple((p @ corners).tolist())

    fig, ax = draw.canvas(
        7.2,
        4.1,
        "Three scores on the simplex: softmax lands inside, sparsemax on the rim",
    )
    ax.add_patch(
        Polygon(
            corners.numpy(),
            closed=True,
            facecolor=draw.tint(draw.ROLE["weight"], 0.12),
            edgecolor=draw.ROLE["weight"],
            lw=1.4,
        )
    )
    for k, (dx, dy, ha) in enumerate(
        ((-0.1, 0.12, "right"), (0.1, 0.12, "left"), (0.12, -0.05, "left"))
    ):
        weights = ["0", "0", "0"]
        weights[k] = "1"
        draw.label(
            ax,
            (corners[k, 0].item() + dx, corners[k, 1].item() + dy),
            f"key {k + 1} only\n({', '.join(weights)})",
            size=draw.SMALL,
            colour=draw.MUTED,
            ha=ha,
        )
    soft, sparse = draw.ROLE["query"], draw.ROLE["key"]
    for name, maps in found.items():
        z, s, p = at(maps["plane"]), at(maps["softmax"]), at(maps["sparsemax"])
        ax.plot(*z, "o", color=draw.INK, ms=6)
        ax.plot([z[0], p[0]], [z[1], p[1]], ls=":", color=sparse, lw=1.3)
        ax.plot(*p, "s", color=sparse, ms=7)
        ax.plot(*s, "o", color=soft, ms=7)
        _curve(ax, z, s, rad=0.25, colour=soft, ls="--")
        draw.label(ax, (z[0], z[1] - 0.1), f"z{name}", size=draw.TEXT, va="top")
    # the tables: scores and the two maps
    for r, name in enumerate(found):
        maps = found[name]
        y = 2.8 - 1.5 * r
        values = torch.stack([maps["z"], maps["softmax"], maps["sparsemax"]])
        grid = draw.matrix(
            ax,
            (5.9, y),
            3,
            3,
            cell=0.42,
            values=values,
            colour=draw.INK,
            fills=[[draw.CARD] * 3, [draw.tint(soft)] * 3, [draw.tint(sparse)] * 3],
            row_labels=[f"scores z{name}", "softmax", "sparsemax"],
            col_labels=["key 1", "key 2", "key 3"],
            gid=f"table:{name}",
            size=draw.SMALL,
        )
        del grid
    draw.legend(
        ax,
        (0.3, 0.72),
        [
            (draw.INK, "scores z, shifted to sum to 1 (neither map sees it)"),
            (soft, "softmax(z): inside, no weight is 0"),
            (sparse, "sparsemax(z): the nearest point, exact zeros"),
        ],
        step=0.28,
    )
    return fig


def differential_example():
    r"""The one query of :func:`differential_maps`: 8 keys, key 2 the signal.

    Both maps share the scores of the distractors (seeded, spread 1). Map 1 scores
    the signal so that it takes about 0.55 of the weight; map 2 scores it 4 below
    the lowest distractor. With keys :math:`\sqrt{d}\,I` (``d = 8``) the scores are
    the queries themselves, so each map is the softmax of chosen scores.

    Returns:
        ``(map1, map2, lam, difference)``, each ``(8,)`` in float64 but ``lam``
        (0.5): the two softmax rows and the row that
        :func:`~attention.differential_attention` computes (with the identity as
        values, its output is its weights).
    """
    j, signal, lam = 8, 2, 0.5
    g = torch.Generator().manual_seed(20)
    common = torch.randn(j, generator=g, dtype=torch.float64)
    s1, s2 = common.clone(), common.clone()
    others = torch.cat([common[:signal], common[signal + 1 :]])
    s1[signal] = torch.logsumexp(others, 0) + 0.2  # a weight of about 0.55
    s2[signal] = common.min() - 4.0
    k = math.sqrt(j) * torch.eye(j, dtype=torch.float64)  # scores = queries
    eye = torch.eye(j, dtype=torch.float64)
    difference = differential_attention(s1[None], s2[None], k, k, eye, lam)[0]
    return softmax(s1), softmax(s2), lam, difference


def differential_maps():
    r"""Differential attention: one query's two softmax rows and their difference.

    Eight keys; key 2 carries the signal. Map 1 puts weight on it and on the keys
    that merely resemble the query; map 2 sees those distractors alone. Subtracting
    :math:`\lambda` times map 2 cancels most of the distractors' weight and keeps the
    signal; the difference row sums to :math:`1 - \lambda` and may dip below zero. The
    numbers (``map1[0,k]``, ``map2[0,k]``, ``scaled[0,k]``, ``difference[0,k]``) come
    from :func:`differential_example`, the last row from
    :func:`~attention.differential_attention`.

    Returns:
        The Figure.
    """
    map1, map2, lam, difference = differential_example()
    j = map1.shape[0]
    rows = [
        ("map1", "map 1: signal and distractors", map1),
        ("map2", "map 2: distractors only", map2),
        ("scaled", f"\u03bb \u00b7 map 2, \u03bb = {lam}", lam * map2),
        ("difference", "map 1 \u2212 \u03bb \u00b7 map 2", difference),
    ]
    fig, ax = draw.canvas(
        7.2, 3.3, "Differential attention subtracts the weight both maps share"
    )
    cell, left, top = 0.5, 2.35, 2.45
    grids = []
    for r, (gid, name, values) in enumerate(rows):
        y = top - 0.62 * r
        bounds = draw.heatmap(
            ax,
            (left + j * cell / 2, y),
            values[None],
            cell=cell,
            vmin=-1.0,
            vmax=1.0,
            cmap="RdBu_r",
            colorbar=None,
            colour=draw.INK,
            gid=gid,
            size=draw.SMALL,
            col_labels=[f"key {k}" for k in range(j)] if r == 0 else None,
        )
        draw.label(ax, (bounds.left - 0.12, y), name, size=draw.SMALL, ha="right")
        grids.append(bounds)
    cax = ax.inset_axes(
        (
            grids[0].right + 0.14,
            grids[-1].bottom,
            0.1,
            grids[0].top - grids[-1].bottom,
        ),
        transform=ax.transData,
    )
    bar = fig.colorbar(
        plt.cm.ScalarMappable(norm=Normalize(-1.0, 1.0), cmap="RdBu_r"), cax=cax
    )
    bar.set_ticks([-1.0, 0.0, 1.0])
    bar.ax.tick_params(labelsize=draw.SMALL, colors=draw.MUTED, length=2)
    bar.outline.set_edgecolor(draw.GRID)
    bar.set_label("weight", fontsize=draw.SMALL, color=draw.MUTED, labelpad=2)
    total = draw.label(
        ax,
        (left + j * cell / 2, top - 0.62 * 3 - 0.42),
        f"the last row sums to 1 \u2212 \u03bb = {difference.sum().item():.2f}: "
        f"key 2 keeps {difference[2].item():.2f}, the others "
        f"{(difference.sum() - difference[2]).item():.2f} together",
        size=draw.SMALL,
        colour=draw.MUTED,
    )
    total.set_gid("sums")
    return fig
