"""Figure helpers used by every chapter: one style, attention heatmaps, masks, grids.

Weights are drawn with rows = queries ``i`` (the attending tokens) and columns =
keys ``j`` (the attended tokens), matching the ``(..., i, j)`` tensors of the package.
Masks follow the package convention: boolean, True = may attend (drawn dark).

Every figure made here fits the book's column: at most :data:`MAX_FIGURE_WIDTH` inches
wide at 100 dpi (750 CSS px), matrices drawn with square cells whose size is capped
whatever the matrix size, ticks thinned beyond :data:`MAX_TICKS` rows or columns, cell
values printed only where a cell is large enough to hold them, weights on a 0-1 scale by
default, and panels that are compared drawn on one colour scale with one colour bar, at
most three panels per row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
import torch
from matplotlib.ticker import MaxNLocator
from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

__all__ = ["use_course_style", "plot_attention", "plot_heads", "plot_mask", "plot_grid"]

COURSE_STYLE: dict[RcKeyType, Any] = {
    # 100 dpi of layout: a 7.5-inch figure is 750 CSS px, the book's column. Notebooks
    # store it at twice that density (``setup_notebook`` selects retina PNGs), so it is
    # sharp on high-density screens.
    "figure.dpi": 100,
    "savefig.dpi": 100,
    # Inline figures are cropped to their content plus this margin; 0.04 in keeps a
    # 7.5 in figure with constrained layout within the 750 px column.
    "savefig.pad_inches": 0.04,
    "figure.figsize": (6.0, 4.0),
    # Every default text size in points (matplotlib's own sizes, made absolute), none
    # below 8 at the size the figure is shown: a figure fits the column, so it is shown
    # at 100 %. Annotations and ax.text take font.size.
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.title_fontsize": 10,
    "figure.titlesize": 12,
    "figure.labelsize": 12,
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "lines.linewidth": 1.8,
}


#: The widest figure, in inches, that fits the book's ~750 CSS px column at 100 dpi.
MAX_FIGURE_WIDTH = 7.5
#: Beyond this many rows or columns, a matrix axis shows a thinned set of ticks.
MAX_TICKS = 16
#: At most this many panels in a row of a grid.
MAX_COLUMNS = 3

_MAX_CELL = 0.45  # inches: a 3 x 3 matrix is not drawn a foot wide
_MATRIX_WIDTH = 5.2  # inches of the figure's width a single matrix may take
_MATRIX_HEIGHT = (
    4.4  # inches of height for the matrices of a figure, whatever their size
)
_ANNOTATE_MAX = 12  # annotate matrices up to this many rows and columns
# points: smaller annotations are not readable, so none are drawn
_ANNOTATE_MIN_FONT = 8.0


def use_course_style() -> None:
    """Apply the course's one figure style (sizes, dpi, colour map) to matplotlib.

    Inside IPython it also stores inline figures as retina PNGs (two device pixels per
    CSS pixel), so they stay sharp on high-density screens at their layout size.
    """
    mpl.rcParams.update(COURSE_STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the dev install
        return
    if get_ipython() is not None:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")


def _as_tensor(weights, name: str) -> Tensor:
    """A tensor with values to draw: a tensor, an array or nested lists of numbers."""
    if weights is None or isinstance(weights, (str, bytes)):
        raise TypeError(
            f"{name} must be a tensor or an array of numbers, "
            f"got {type(weights).__name__}"
        )
    if not isinstance(weights, Tensor):
        try:
            weights = torch.as_tensor(weights)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"{name} must be a tensor or an array of numbers, got "
                f"{type(weights).__name__}"
            ) from err
    if weights.device.type == "meta":
        raise ValueError(
            f"{name} is a meta tensor: it has a shape but no values to draw"
        )
    if weights.is_complex():
        raise TypeError(f"{name} must be real, got {weights.dtype}")
    return weights


def _check_labels(name: str, labels, n: int) -> None:
    """None, or one string per row (or column) of the matrix."""
    if labels is None:
        return
    if isinstance(labels, (str, bytes, Tensor)) or not isinstance(labels, Sequence):
        raise TypeError(
            f"{name} must be a sequence of strings, one per position, "
            f"got {type(labels).__name__}"
        )
    if len(labels) != n:
        raise ValueError(
            f"{name} must have one label per position: {n} positions, "
            f"got {len(labels)} labels"
        )


def _as_matrix(weights, name: str) -> Tensor:
    weights = _as_tensor(weights, name)
    if weights.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D (i, j) matrix, got shape {tuple(weights.shape)}"
        )
    return weights.detach().to("cpu", torch.float64)


def _colour_range(mats: Sequence[Tensor], vmin: float | None, vmax: float | None):
    """One colour range for all ``mats``: 0-1 for weights, else the data's own range."""
    finite = [m[m.isfinite()] for m in mats]
    finite = torch.cat([f.flatten() for f in finite]) if finite else torch.zeros(0)
    lo = float(finite.min()) if finite.numel() else 0.0
    hi = float(finite.max()) if finite.numel() else 1.0
    if vmin is None:
        vmin = 0.0 if lo >= 0.0 else lo
    if vmax is None:
        vmax = 1.0 if vmin == 0.0 and hi <= 1.0 else hi
    if vmax <= vmin:  # a constant matrix: any non-empty range shows it
        vmax = vmin + 1.0
    return vmin, vmax


def _aspect(n_rows: int, n_cols: int) -> str:
    """Square cells, unless the matrix is so elongated that it would be a hairline."""
    return "equal" if max(n_rows, n_cols) <= 8 * min(n_rows, n_cols) else "auto"


def _cell_inches(ax, n_rows: int, n_cols: int) -> float:
    """Side of one cell, in inches, as the axes will draw it (an estimate before
    layout)."""
    fig_w, fig_h = ax.figure.get_size_inches()
    pos = ax.get_position()
    # Constrained layout later takes room for labels and colour bars: assume 80 % is
    # left.
    w, h = 0.8 * pos.width * fig_w / n_cols, 0.8 * pos.height * fig_h / n_rows
    return min(w, h) if _aspect(n_rows, n_cols) == "equal" else w


def _label_width_inches(labels: Sequence[str], fontsize: float) -> float:
    return max((len(str(s)) for s in labels), default=0) * 0.6 * fontsize / 72


def _set_ticks(
    ax, n: int, labels: Sequence[str] | None, axis: str, cell: float
) -> None:
    """Ticks on one axis of a matrix: integers, all of them up to MAX_TICKS, then
    thinned.

    Key (x) labels are rotated only when the widest would overlap its neighbour.
    """
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    if labels is None:
        if n <= MAX_TICKS:
            setter(range(n))
        else:
            (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(
                MaxNLocator(nbins=8, integer=True, min_n_ticks=3)
            )
        return
    labels = [str(s) for s in labels]
    if len(labels) != n:
        raise ValueError(f"got {len(labels)} labels for an axis of size {n}")
    step = 1 if n <= MAX_TICKS else math.ceil(n / MAX_TICKS)
    where = list(range(0, n, step))
    shown = [labels[k] for k in where]
    if axis == "y":
        ax.set_yticks(where, shown)
        return
    fontsize = mpl.rcParams["xtick.labelsize"]
    fontsize = (
        fontsize if isinstance(fontsize, (int, float)) else mpl.rcParams["font.size"]
    )
    if _label_width_inches(shown, fontsize) > 0.9 * cell * step:
        ax.set_xticks(where, shown, rotation=45, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(where, shown)


def _annotate(ax, im, w: Tensor, cell: float) -> None:
    """Print each value (2 decimals) in its cell, sized to the cell; skip if unreadable.

    The text is black on light cells and white on dark ones, judged by the luminance of
    the cell's colour, so it stays readable on sequential and diverging colour maps
    alike.
    """
    fontsize = min(10.0, 0.36 * cell * 72)  # "0.00" is about 2.4 font sizes wide
    if max(w.shape) > _ANNOTATE_MAX or fontsize < _ANNOTATE_MIN_FONT:
        return
    for r in range(w.shape[0]):
        for c in range(w.shape[1]):
            v = float(w[r, c])
            red, green, blue, _ = im.cmap(im.norm(v))
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
            text = f"{v:.2f}" if round(v, 2) != 0 else "0.00"  # no "-0.00"
            ax.text(
                c,
                r,
                text,
                ha="center",
                va="center",
                fontsize=fontsize,
                color="black" if light else "white",
            )


def _matrix_panel(
    ax,
    w: Tensor,
    query_labels,
    key_labels,
    *,
    title,
    vmin,
    vmax,
    cmap,
    annotate,
    xlabel,
    ylabel,
):
    """Draw one ``(i, j)`` matrix on ``ax`` with capped ticks and scaled annotations."""
    n_rows, n_cols = w.shape
    im = ax.imshow(
        w.numpy(),
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        aspect=_aspect(n_rows, n_cols),
        interpolation="nearest",
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    cell = _cell_inches(ax, n_rows, n_cols)
    _set_ticks(ax, n_cols, key_labels, "x", cell)
    _set_ticks(ax, n_rows, query_labels, "y", cell)
    if annotate:
        _annotate(ax, im, w, cell)
    return im


def _matrix_figsize(n_rows: int, n_cols: int, *, extra_w: float, extra_h: float):
    """Size of a figure holding one matrix: square cells of capped size, within the
    column."""
    cell = min(_MAX_CELL, _MATRIX_WIDTH / n_cols, _MATRIX_HEIGHT / n_rows)
    if _aspect(n_rows, n_cols) == "auto":  # an elongated matrix: fill a readable strip
        return (
            min(MAX_FIGURE_WIDTH, max(3.5, n_cols * cell + extra_w)),
            max(1.8, min(_MATRIX_HEIGHT, n_rows * cell) + extra_h),
        )
    return (
        min(MAX_FIGURE_WIDTH, max(3.5, n_cols * cell + extra_w)),
        n_rows * cell + extra_h,
    )


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax=None,
    title: str = "Attention weights",
    annotate: bool = False,
    colorbar: bool = True,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str | None = None,
    cbar_label: str = "weight",
):
    """Heatmap of an ``(i, j)`` weight matrix: rows are queries, columns keys.

    Cells are square and capped in size, so a 64 x 64 matrix fits the column as well as
    a 3 x 3 one; ticks are thinned beyond 16 rows or columns; key labels are rotated
    only where they would overlap.

    Args:
        weights: ``(i, j)`` tensor.
        query_labels / key_labels: token strings for the axes (``i`` and ``j`` of them).
        ax: axes to draw on (a new figure within the column if None).
        annotate: print each value (2 decimals) in its cell, in a font sized to the
            cell; matrices over 12 rows or columns, or with cells too small to read, are
            not annotated.
        colorbar: add a colour bar labelled ``cbar_label``.
        vmin, vmax: colour range. By default 0-1 when the values lie in [0, 1]
            (attention weights, so figures are comparable), else the data's own range;
            pass both when several heatmaps are compared, or use :func:`plot_grid`.
        cmap: matplotlib colour map (the style's viridis if None).

    Returns:
        The matplotlib axes.

    Example:
        >>> import torch
        >>> from attention import plot_attention
        >>> ax = plot_attention(torch.softmax(torch.randn(3, 4), -1), title="toy")
        >>> ax.images[0].get_clim()
        (0.0, 1.0)
    """
    w = _as_matrix(weights, "weights")
    n_rows, n_cols = w.shape
    _check_labels("query_labels", query_labels, n_rows)
    _check_labels("key_labels", key_labels, n_cols)
    vmin, vmax = _colour_range([w], vmin, vmax)
    if ax is None:
        label_w = _label_width_inches(query_labels or [], 10)
        import matplotlib.pyplot as plt  # here, so `import attention` stays light

        _, ax = plt.subplots(
            figsize=_matrix_figsize(
                n_rows,
                n_cols,
                extra_w=1.3 + label_w + 1.0 * colorbar,
                extra_h=1.2 + 0.5 * (key_labels is not None),
            ),
            constrained_layout=True,
        )
    im = _matrix_panel(
        ax,
        w,
        query_labels,
        key_labels,
        title=title,
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        annotate=annotate,
        xlabel="key position j (attended)",
        ylabel="query position i (attending)",
    )
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label=cbar_label, shrink=0.9)
    return ax


def _mask_panel(ax, m: Tensor, *, title, query_labels=None, key_labels=None):
    n_rows, n_cols = m.shape
    ax.imshow(
        m.numpy(),
        cmap="Greys",
        vmin=0,
        vmax=1,
        aspect=_aspect(n_rows, n_cols),
        interpolation="nearest",
    )
    for spine in ax.spines.values():  # blocked cells are white: keep the frame visible
        spine.set_visible(True)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title)
    cell = _cell_inches(ax, n_rows, n_cols)
    _set_ticks(ax, n_cols, key_labels, "x", cell)
    _set_ticks(ax, n_rows, query_labels, "y", cell)


def plot_mask(mask: Tensor, *, ax=None, title: str = "Mask (True = may attend)"):
    """Draw a boolean ``(i, j)`` mask: dark = may attend (True), light = blocked
    (False).

    The mask follows the package convention, True = may attend, as in
    ``torch.nn.functional.scaled_dot_product_attention``. Cells are square and capped in
    size; ticks are integer positions, thinned beyond 16.

    Args:
        mask: ``(i, j)`` boolean (or 0/1) tensor.
        ax: axes to draw on (a new figure within the column if None).
        title: the panel's title.

    Returns:
        The matplotlib axes.

    Example:
        >>> from attention import causal_mask, plot_mask
        >>> ax = plot_mask(causal_mask(4))
        >>> [int(t) for t in ax.get_xticks()]
        [0, 1, 2, 3]
    """
    m = _as_matrix(mask, "mask")
    if ax is None:
        import matplotlib.pyplot as plt  # here, so `import attention` stays light

        _, ax = plt.subplots(
            figsize=_matrix_figsize(*m.shape, extra_w=1.3, extra_h=1.1),
            constrained_layout=True,
        )
    _mask_panel(ax, m, title=title)
    return ax


def plot_grid(
    matrices: Sequence[Tensor] | Tensor,
    titles: Sequence[str] | None = None,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    mask: bool = False,
    ncols: int = MAX_COLUMNS,
    title: str | None = None,
    annotate: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str | None = None,
    cbar_label: str = "weight",
):
    """Several ``(i, j)`` matrices side by side, to be compared: one scale, one colour
    bar.

    Every panel has square cells of one size, so a row of panels lines up row for row (a
    matrix of 3 rows beside one of 8 is drawn 3/8 as tall, not stretched), and at most
    three panels share a row. Heatmaps share one colour range (0-1 for weights by
    default) and one colour bar; masks (``mask=True``, boolean, True = may attend, drawn
    dark) need no colour bar.

    Args:
        matrices: a list or tuple of ``(i, j)`` tensors (shapes may differ), or an
            ``(h, i, j)`` tensor.
        titles: one title per panel.
        query_labels / key_labels: token strings for the axes of every panel.
        mask: draw the matrices as boolean masks.
        ncols: panels per row (at most 3).
        title: a title over the whole figure.
        annotate: print the values in small heatmaps (see :func:`plot_attention`).
        vmin, vmax, cmap, cbar_label: the shared colour scale and its colour bar's
            label.

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> from attention import plot_grid
        >>> fig = plot_grid([torch.rand(3, 4), torch.rand(3, 4)], ["a", "b"])
        >>> [ax.images[0].get_clim() for ax in fig.axes if ax.images]
        [(0.0, 1.0), (0.0, 1.0)]
    """
    if isinstance(matrices, Tensor):
        if matrices.dim() != 3:
            raise ValueError(
                "a tensor of matrices must be (h, i, j), "
                f"got shape {tuple(matrices.shape)}"
            )
        matrices = list(matrices)
    if not isinstance(matrices, (list, tuple)):
        raise TypeError(
            "matrices must be a list or tuple of (i, j) tensors or an (h, i, j) "
            f"tensor, got {type(matrices).__name__}"
        )
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be an int >= 1, got {ncols!r}")
    mats = [_as_matrix(m, "each matrix") for m in matrices]
    if not mats:
        raise ValueError("plot_grid needs at least one matrix")
    if titles is not None and len(titles) != len(mats):
        raise ValueError(f"got {len(titles)} titles for {len(mats)} matrices")
    ncols = min(ncols, MAX_COLUMNS, len(mats))
    rows = [mats[r : r + ncols] for r in range(0, len(mats), ncols)]
    vmin, vmax = _colour_range(mats, vmin, vmax)

    # One cell size for the whole figure: the widest row of panels and the tallest stack
    # of rows must both fit.
    label_w = _label_width_inches(query_labels or [], 10)
    per_panel_w = 0.75 + label_w  # tick labels and padding around each panel
    extra_w = 0.5 + (0.0 if mask else 1.0)  # the row's y label, the colour bar
    widest = max(sum(m.shape[1] for m in row) for row in rows)
    avail_w = MAX_FIGURE_WIDTH - extra_w - per_panel_w * ncols
    tallest = sum(max(m.shape[0] for m in row) for row in rows)
    cell = min(
        _MAX_CELL,
        avail_w / widest,
        _MATRIX_HEIGHT * (1 + 0.25 * (len(rows) - 1)) / tallest,
    )
    width_ratios = [max(m.shape[1] for m in mats[c::ncols]) for c in range(ncols)]
    height_ratios = [max(m.shape[0] for m in row) for row in rows]
    per_row_h = 1.3 + 0.45 * (key_labels is not None) + 0.25 * (titles is not None)
    fig_w = min(
        MAX_FIGURE_WIDTH, sum(width_ratios) * cell + per_panel_w * ncols + extra_w
    )
    fig_h = (
        sum(height_ratios) * cell + per_row_h * len(rows) + 0.4 * (title is not None)
    )
    import matplotlib.pyplot as plt  # here, so `import attention` stays light

    fig, axes = plt.subplots(
        len(rows),
        ncols,
        figsize=(fig_w, fig_h),
        squeeze=False,
        width_ratios=width_ratios,
        height_ratios=height_ratios,
        constrained_layout=True,
    )
    drawn, im = [], None
    for n, ax in enumerate(axes.flat):
        if n >= len(mats):
            ax.axis("off")
            continue
        name = titles[n] if titles is not None else ""
        if mask:
            _mask_panel(
                ax,
                mats[n],
                title=name,
                query_labels=query_labels,
                key_labels=key_labels,
            )
        else:
            im = _matrix_panel(
                ax,
                mats[n],
                query_labels,
                key_labels,
                title=name,
                vmin=vmin,
                vmax=vmax,
                cmap=cmap,
                annotate=annotate,
                xlabel="key position j",
                ylabel="query position i",
            )
        ax.set_anchor("N")  # panels of fewer rows hang from the same top line
        if n % ncols:
            ax.set_ylabel("")
        if n + ncols < len(mats):
            ax.set_xlabel("")
        drawn.append(ax)
    if im is not None:
        fig.colorbar(
            im, ax=drawn, label=cbar_label, shrink=0.85 if len(rows) > 1 else 0.95
        )
    if title is not None:
        fig.suptitle(title)
    return fig


def plot_heads(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ncols: int = MAX_COLUMNS,
    title: str = "Attention weights per head",
    head_names: Sequence[str] | None = None,
):
    """A grid of heatmaps, one per head, for ``(h, i, j)`` weights, on one 0-1 colour
    scale.

    At most three heads per row, one colour bar for all (see :func:`plot_grid`).

    Args:
        weights: ``(h, i, j)`` tensor.
        query_labels / key_labels: token strings for the axes.
        ncols: heads per row (at most 3).
        title: the figure's title.
        head_names: one name per head (``head 0``, ``head 1`` ... if None).

    Returns:
        The matplotlib figure.

    Example:
        >>> import torch
        >>> from attention import plot_heads
        >>> fig = plot_heads(torch.softmax(torch.randn(4, 3, 3), -1))
        >>> sum(1 for ax in fig.axes if ax.images)
        4
    """
    weights = _as_tensor(weights, "weights")
    if weights.dim() != 3:
        raise ValueError(f"weights must be (h, i, j), got shape {tuple(weights.shape)}")
    h = weights.shape[0]
    if head_names is not None:
        if isinstance(head_names, (str, bytes, Tensor)) or not isinstance(
            head_names, Sequence
        ):
            raise TypeError(
                "head_names must be a sequence of strings, "
                f"got {type(head_names).__name__}"
            )
        if len(head_names) != h:
            raise ValueError(
                f"head_names must have one name per head: {h} heads, "
                f"got {len(head_names)} names"
            )
    _check_labels("query_labels", query_labels, weights.shape[1])
    _check_labels("key_labels", key_labels, weights.shape[2])
    names = (
        list(head_names) if head_names is not None else [f"head {n}" for n in range(h)]
    )
    return plot_grid(
        list(weights),
        names,
        query_labels=query_labels,
        key_labels=key_labels,
        ncols=ncols,
        title=title,
    )
