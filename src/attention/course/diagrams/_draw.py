"""Drawing primitives for the chapters' conceptual diagrams.

A diagram is drawn on one axes that covers its whole figure, in inches: ``(0, 0)`` is
the bottom-left corner and ``(width, height)`` the top-right, so a matrix of four
0.3-inch cells is 1.2 inches wide whatever else the figure holds. :func:`canvas` makes
that figure: a light card with rounded corners on a transparent background, so the
diagram reads the same on the book's light and dark pages, sized for its 750 px column
(at most :data:`MAX_WIDTH` inches, cropped margin included) and titled.

The primitives draw on that axes and return where they drew (:class:`Bounds`), so the
next one can be placed against it: :func:`matrix` (a grid of cells with its name above
and its shape, e.g. ``(n, d)``, below, optionally its numbers in the cells),
:func:`heatmap` (cells coloured by their numbers, with a colour bar), :func:`box`,
:func:`arrow`, :func:`brace`, :func:`bracket` and :func:`label`. Colours come from one
palette (:data:`INK`, :data:`ROLE` ...), text is never smaller than :data:`MIN_FONT`
points, and a number drawn from a tensor carries a ``gid`` naming its entry, so a test
can read it back and compare it with the computation it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import Normalize, to_rgb
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, PathPatch, Rectangle
from matplotlib.path import Path

#: Widest diagram, in inches: with the 0.04-inch margin that inline figures are
#: cropped to, 7.4 inches stay within the book's 750 px column at 100 dpi.
MAX_WIDTH = 7.4
#: No text in a diagram is smaller than this, in points.
MIN_FONT = 8.0
#: Font sizes, in points: the title, names and labels, small notes and cell numbers.
TITLE, TEXT, SMALL = 11.0, 10.0, 8.5

CARD = "#f7f5f0"  # the light card every diagram is drawn on
CARD_EDGE = "#d9d4c7"
INK = "#1f2430"  # text, arrows, outlines
MUTED = "#5b6170"  # shapes and notes: secondary text, still dark on the card
GRID = "#8a8f99"  # cell borders
#: One colour per role, the same in every diagram (Okabe-Ito: safe for colour-blind
#: readers): inputs, queries, keys, values, weights.
ROLE = {
    "input": "#6b7280",
    "query": "#0072b2",
    "key": "#d55e00",
    "value": "#009e73",
    "weight": "#7e57c2",
}
#: Mask cells: True (may attend) dark, False (blocked) light, as in ``plot_mask``.
MAY_ATTEND, BLOCKED = "#2f3a4a", "#ebe7de"
#: The colour map of weights in [0, 1]: light to dark purple, black numbers readable.
WEIGHT_CMAP = "Purples"


def tint(colour: str, amount: float = 0.25) -> tuple[float, float, float]:
    """``colour`` mixed with white: ``amount`` of the colour, the rest white."""
    r, g, b = to_rgb(colour)
    return (1 - amount + amount * r, 1 - amount + amount * g, 1 - amount + amount * b)


def ink_on(fill) -> str:
    """Black or white text, whichever reads on ``fill`` (judged by its luminance)."""
    r, g, b = to_rgb(fill)
    return INK if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


@dataclass(frozen=True)
class Bounds:
    """Where a primitive drew, in inches: its box, with its four edge midpoints."""

    left: float
    bottom: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def top(self) -> float:
        return self.bottom + self.height

    @property
    def centre(self) -> tuple[float, float]:
        return (self.left + self.width / 2, self.bottom + self.height / 2)

    @property
    def west(self) -> tuple[float, float]:
        return (self.left, self.centre[1])

    @property
    def east(self) -> tuple[float, float]:
        return (self.right, self.centre[1])

    @property
    def north(self) -> tuple[float, float]:
        return (self.centre[0], self.top)

    @property
    def south(self) -> tuple[float, float]:
        return (self.centre[0], self.bottom)


def canvas(width: float, height: float, title: str):
    """A new diagram: a ``width`` x ``height`` inch card with ``title`` at its top.

    Returns:
        ``(fig, ax)``: the figure and its one axes, whose data coordinates are inches
        from the bottom-left corner. The title is the figure's suptitle, inside the
        card; leave about 0.5 inch free below the top for it.
    """
    if not 0 < width <= MAX_WIDTH:
        raise ValueError(f"a diagram is at most {MAX_WIDTH} inches wide, got {width}")
    fig = plt.figure(figsize=(width, height), facecolor="none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    ax.add_patch(
        FancyBboxPatch(
            (0.03, 0.03),
            width - 0.06,
            height - 0.06,
            boxstyle="round,pad=0,rounding_size=0.14",
            facecolor=CARD,
            edgecolor=CARD_EDGE,
            linewidth=1.0,
            zorder=-10,
        )
    )
    fig.suptitle(title, y=1 - 0.16 / height, va="top", fontsize=TITLE, color=INK)
    return fig, ax


def label(
    ax, xy, s: str, *, size: float = TEXT, colour: str | tuple[float, ...] = INK, **kw
):
    """Text at ``xy`` (inches), centred unless ``ha``/``va`` say otherwise."""
    kw.setdefault("ha", "center")
    kw.setdefault("va", "center")
    return ax.text(*xy, s, fontsize=max(size, MIN_FONT), color=colour, **kw)


def _fmt(fmt: str, v: float) -> str:
    text = fmt.format(v)
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.00"


def matrix(
    ax,
    xy,
    rows: int,
    cols: int,
    *,
    cell: float = 0.3,
    name: str | None = None,
    shape: str | None = None,
    values=None,
    fmt: str = "{:.2f}",
    colour: str = ROLE["input"],
    fills=None,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    gid: str | None = None,
    size: float = 9.0,
    name_size: float = TEXT,
) -> Bounds:
    """A ``rows`` x ``cols`` grid of square cells, centred at ``xy``.

    Args:
        xy: centre of the grid, in inches.
        cell: side of a cell, in inches.
        name: written above the grid ("Q"); shape: written below it ("(n, d)").
        values: ``(rows, cols)`` numbers printed in the cells with ``fmt``.
        colour: the role colour: cells are a light tint of it, the border is it.
        fills: ``(rows, cols)`` colours of the cells, instead of the tint.
        row_labels / col_labels: written left of the rows / above the columns.
        gid: each cell's patch, and its number's text, get the gid ``f"{gid}[r,c]"``.
        size: font size of the numbers; name_size: of the name (a name with a
            mathtext subscript, ``"$W_Q$"``, needs 12 points for an 8-point subscript).

    Returns:
        The grid's :class:`Bounds` (names, shapes and labels lie outside it).
    """
    left, bottom = xy[0] - cols * cell / 2, xy[1] - rows * cell / 2
    for r in range(rows):
        for c in range(cols):
            fill = fills[r][c] if fills is not None else tint(colour)
            x, y = left + c * cell, bottom + (rows - 1 - r) * cell
            patch = Rectangle(
                (x, y), cell, cell, facecolor=fill, edgecolor=GRID, lw=0.6
            )
            ax.add_patch(patch)
            if gid is not None:
                patch.set_gid(f"{gid}[{r},{c}]")
            if values is not None:
                t = label(
                    ax,
                    (x + cell / 2, y + cell / 2),
                    _fmt(fmt, float(values[r][c])),
                    size=size,
                    colour=ink_on(fill),
                )
                if gid is not None:
                    t.set_gid(f"{gid}[{r},{c}]")
    bounds = Bounds(left, bottom, cols * cell, rows * cell)
    ax.add_patch(
        Rectangle(
            (left, bottom),
            cols * cell,
            rows * cell,
            fill=False,
            edgecolor=colour,
            lw=1.6,
        )
    )
    top = bounds.top
    if col_labels is not None:
        for c, s in enumerate(col_labels):
            label(
                ax,
                (left + (c + 0.5) * cell, top + 0.06),
                s,
                size=SMALL,
                colour=MUTED,
                va="bottom",
            )
        top += 0.22
    if name is not None:
        label(
            ax,
            (bounds.centre[0], top + 0.07),
            name,
            va="bottom",
            colour=colour,
            fontweight="bold",
            size=name_size,
        )
    if row_labels is not None:
        for r, s in enumerate(row_labels):
            label(
                ax,
                (left - 0.1, row_centre(bounds, r, cell)),
                s,
                size=SMALL,
                colour=MUTED,
                ha="right",
            )
    if shape is not None:
        label(
            ax,
            (bounds.centre[0], bottom - 0.07),
            shape,
            size=SMALL,
            colour=MUTED,
            va="top",
        )
    return bounds


def row_centre(bounds: Bounds, r: int, cell: float) -> float:
    """The height of the centre of row ``r`` (0 at the top) of a grid."""
    return bounds.top - (r + 0.5) * cell


def heatmap(
    ax,
    xy,
    values,
    *,
    cell: float = 0.4,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = WEIGHT_CMAP,
    colorbar: str | None = "weight",
    colour: str = ROLE["weight"],
    fmt: str = "{:.2f}",
    **kw,
) -> Bounds:
    """A matrix whose cells are coloured by ``values``, with a colour bar to its right.

    The colour carries the number, so a colour bar labelled ``colorbar`` says which
    colour is which value (pass ``colorbar=None`` only when another heatmap of the same
    figure has the bar for this scale). The numbers are printed too (see
    :func:`matrix`, whose options ``name``, ``shape``, ``row_labels`` ... apply).

    Returns:
        The grid's :class:`Bounds` (the colour bar lies to its right, 0.5 inch wide).
    """
    values = np.asarray(values, dtype=float)
    norm, colours = Normalize(vmin, vmax), plt.get_cmap(cmap)
    fills = [[colours(norm(v)) for v in row] for row in values]
    bounds = matrix(
        ax,
        xy,
        *values.shape,
        cell=cell,
        values=values,
        fmt=fmt,
        colour=colour,
        fills=fills,
        **kw,
    )
    if colorbar is not None:
        cax = ax.inset_axes(
            [bounds.right + 0.14, bounds.bottom, 0.1, bounds.height],
            transform=ax.transData,
        )
        bar = ax.figure.colorbar(
            plt.cm.ScalarMappable(norm=norm, cmap=colours), cax=cax
        )
        bar.set_ticks([vmin, (vmin + vmax) / 2, vmax])
        bar.ax.tick_params(labelsize=SMALL, colors=MUTED, length=2)
        bar.outline.set_edgecolor(GRID)
        bar.set_label(colorbar, fontsize=SMALL, color=MUTED, labelpad=2)
    return bounds


def box(
    ax,
    xy,
    s: str,
    *,
    width: float | None = None,
    height: float = 0.34,
    colour: str = INK,
    size: float = TEXT,
) -> Bounds:
    """A rounded box with ``s`` inside, centred at ``xy`` (an operation: "softmax").

    Its width fits the text unless given.
    """
    lines = s.splitlines() or [""]
    width = width or max(len(line) for line in lines) * 0.58 * size / 72 + 0.3
    height = max(height, len(lines) * 1.3 * size / 72 + 0.12)
    bounds = Bounds(xy[0] - width / 2, xy[1] - height / 2, width, height)
    ax.add_patch(
        FancyBboxPatch(
            (bounds.left, bounds.bottom),
            width,
            height,
            boxstyle="round,pad=0,rounding_size=0.08",
            facecolor=tint(colour, 0.12),
            edgecolor=colour,
            lw=1.2,
        )
    )
    label(ax, xy, s, size=size, colour=INK)
    return bounds


def arrow(
    ax,
    start,
    end,
    *,
    text: str | None = None,
    colour: str = INK,
    side: str = "above",
    size: float = SMALL,
):
    """An arrow from ``start`` to ``end`` (points in inches, e.g. ``a.east, b.west``).

    ``text`` is written beside its middle: ``side`` "above", "below", "left" or "right".
    """
    patch = FancyArrowPatch(
        start,
        end,
        arrowstyle="-|>",
        mutation_scale=12,
        lw=1.4,
        color=colour,
        shrinkA=2,
        shrinkB=2,
    )
    ax.add_patch(patch)
    if text is not None:
        mid = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        offset = {
            "above": (0, 0.07),
            "below": (0, -0.07),
            "left": (-0.08, 0),
            "right": (0.08, 0),
        }[side]
        align = {
            "above": ("center", "bottom"),
            "below": ("center", "top"),
            "left": ("right", "center"),
            "right": ("left", "center"),
        }[side]
        label(
            ax,
            (mid[0] + offset[0], mid[1] + offset[1]),
            text,
            size=size,
            colour=colour if colour != INK else MUTED,
            ha=align[0],
            va=align[1],
        )
    return patch


_NORMAL = {
    "above": (0.0, 1.0),
    "below": (0.0, -1.0),
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
}


def brace(
    ax,
    start,
    end,
    text: str | None = None,
    *,
    side: str = "below",
    depth: float = 0.14,
    colour: str = MUTED,
    size: float = SMALL,
):
    """A curly brace from ``start`` to ``end``, its tip pointing to ``side``.

    ``text`` is written beyond the tip. Used to group cells: "one row per query".
    """
    p0, p1 = np.asarray(start, float), np.asarray(end, float)
    u = (p1 - p0) / np.linalg.norm(p1 - p0)
    n = np.asarray(_NORMAL[side])
    r = min(depth / 2, np.linalg.norm(p1 - p0) / 6)
    m = (p0 + p1) / 2
    points = [
        p0,
        p0 + n * r,
        p0 + n * r + u * r,
        m - u * r + n * r,
        m + n * r,
        m + 2 * n * r,
        m + n * r,
        m + u * r + n * r,
        p1 - u * r + n * r,
        p1 + n * r,
        p1,
    ]
    codes = [
        Path.MOVETO,
        Path.CURVE3,
        Path.CURVE3,
        Path.LINETO,
        Path.CURVE3,
        Path.CURVE3,
        Path.CURVE3,
        Path.CURVE3,
        Path.LINETO,
        Path.CURVE3,
        Path.CURVE3,
    ]
    ax.add_patch(PathPatch(Path(points, codes), fill=False, edgecolor=colour, lw=1.1))
    if text is not None:
        _beside(ax, m + n * (2 * r + 0.06), text, side, colour, size)


def bracket(
    ax,
    start,
    end,
    text: str | None = None,
    *,
    side: str = "below",
    depth: float = 0.08,
    colour: str = MUTED,
    size: float = SMALL,
):
    """A square bracket from ``start`` to ``end``, open towards the cells it groups."""
    p0, p1 = np.asarray(start, float), np.asarray(end, float)
    n = np.asarray(_NORMAL[side])
    points = [p0, p0 + n * depth, p1 + n * depth, p1]
    ax.add_patch(PathPatch(Path(points), fill=False, edgecolor=colour, lw=1.1))
    if text is not None:
        _beside(ax, (p0 + p1) / 2 + n * (depth + 0.06), text, side, colour, size)


def outline(ax, bounds: Bounds, *, colour: str = INK, pad: float = 0.04):
    """A dashed rectangle around ``bounds``: a row or block of cells to follow."""
    ax.add_patch(
        Rectangle(
            (bounds.left - pad, bounds.bottom - pad),
            bounds.width + 2 * pad,
            bounds.height + 2 * pad,
            fill=False,
            edgecolor=colour,
            lw=1.8,
            linestyle=(0, (4, 2)),
        )
    )


def row(bounds: Bounds, r: int, cell: float) -> Bounds:
    """The :class:`Bounds` of row ``r`` (0 at the top) of a grid drawn by ``matrix``."""
    return Bounds(bounds.left, bounds.top - (r + 1) * cell, bounds.width, cell)


def legend(
    ax, xy, items: Sequence[tuple[str | tuple[float, ...], str]], *, step: float = 0.3
) -> Bounds:
    """Swatches with their meaning, one per line from ``xy`` (top-left) down.

    ``items`` are ``(colour, text)`` pairs, e.g. ``(MAY_ATTEND, "True: may attend")``.
    """
    x, y = xy
    for k, (fill, text) in enumerate(items):
        yk = y - k * step
        ax.add_patch(
            Rectangle(
                (x, yk - 0.09), 0.18, 0.18, facecolor=fill, edgecolor=GRID, lw=0.6
            )
        )
        label(ax, (x + 0.26, yk), text, size=SMALL, ha="left")
    return Bounds(
        x, y - (len(items) - 1) * step - 0.09, 1.5, (len(items) - 1) * step + 0.18
    )


def _beside(ax, xy, text, side, colour, size):
    ha = {"left": "right", "right": "left"}.get(side, "center")
    va = {"above": "bottom", "below": "top"}.get(side, "center")
    label(ax, tuple(xy), text, size=size, colour=colour, ha=ha, va=va)
