"""Figure helpers used by every chapter: one style, attention heatmaps, grids of heads.

Weights are drawn with rows = queries ``i`` (the attending tokens) and columns =
keys ``j`` (the attended tokens), matching the ``(..., i, j)`` tensors of the package.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from torch import Tensor

__all__ = ["use_course_style", "plot_attention", "plot_heads", "plot_mask"]

COURSE_STYLE = {
    # 100 dpi of layout: a 7.5-inch figure is 750 CSS px, the book's column. Notebooks
    # store it at twice that density (``setup_notebook`` selects retina PNGs), so it is
    # sharp on high-density screens.
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.figsize": (6.0, 4.0),
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 10,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "lines.linewidth": 1.8,
}


#: The widest figure, in inches, that fits the book's ~750 CSS px column at 100 dpi.
MAX_FIGURE_WIDTH = 7.5


def use_course_style() -> None:
    """Apply the course's one figure style (sizes, dpi, colour map) to matplotlib.

    Inside IPython it also stores inline figures as retina PNGs (two device pixels per
    CSS pixel), so they stay sharp on high-density screens at their layout size.
    """
    plt.rcParams.update(COURSE_STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the dev install
        return
    if get_ipython() is not None:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")


def _as_matrix(weights: Tensor, name: str) -> Tensor:
    if not isinstance(weights, Tensor):
        weights = torch.as_tensor(weights)
    if weights.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (i, j) matrix, got shape {tuple(weights.shape)}")
    return weights.detach().to("cpu", torch.float64)


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax=None,
    title: str = "Attention weights",
    annotate: bool = False,
    colorbar: bool = True,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    cmap: str | None = None,
    cbar_label: str = "weight",
):
    """Heatmap of an ``(i, j)`` weight matrix: rows are queries, columns keys.

    Args:
        weights: ``(i, j)`` tensor.
        query_labels / key_labels: token strings for the axes.
        ax: axes to draw on (a new figure if None).
        annotate: print each value (2 decimals) in its cell.
        colorbar: add a colour bar labelled ``cbar_label``.

    Returns:
        The matplotlib axes.
    """
    w = _as_matrix(weights, "weights")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.45 * w.shape[1], 0.8 + 0.4 * w.shape[0]))
    im = ax.imshow(w.numpy(), vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    ax.set_xlabel("key position j (attended)")
    ax.set_ylabel("query position i (attending)")
    ax.set_title(title)
    for labels, n, setter, rot in (
        (key_labels, w.shape[1], (ax.set_xticks, ax.set_xticklabels), 45),
        (query_labels, w.shape[0], (ax.set_yticks, ax.set_yticklabels), 0),
    ):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(f"got {len(labels)} labels for an axis of size {n}")
            setter[0](range(n))
            setter[1](labels, rotation=rot)
    if annotate:
        for r in range(w.shape[0]):
            for c in range(w.shape[1]):
                ax.text(c, r, f"{w[r, c]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[r, c] < 0.5 * (w.max() + w.min()) else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label=cbar_label)
    return ax


def plot_mask(mask: Tensor, *, ax=None, title: str = "Mask (True = may attend)"):
    """Draw a boolean ``(i, j)`` mask: dark = may attend, light = blocked."""
    m = _as_matrix(mask, "mask")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.3 * m.shape[1], 0.8 + 0.3 * m.shape[0]))
    ax.imshow(m.numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto")
    for spine in ax.spines.values():  # blocked cells are white: keep the frame visible
        spine.set_visible(True)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title)
    return ax


def plot_heads(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ncols: int = 4,
    title: str = "Attention weights per head",
    head_names: Sequence[str] | None = None,
):
    """A grid of heatmaps, one per head, for ``(h, i, j)`` weights, sharing one colour bar.

    Returns:
        The matplotlib figure.
    """
    if not isinstance(weights, Tensor):
        weights = torch.as_tensor(weights)
    if weights.dim() != 3:
        raise ValueError(f"weights must be (h, i, j), got shape {tuple(weights.shape)}")
    h = weights.shape[0]
    ncols = max(1, min(ncols, h))
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols + 0.8, 2.4 * nrows + 0.4),
                             squeeze=False, constrained_layout=True)
    vmax = float(weights.max())
    for n, ax in enumerate(axes.flat):
        if n >= h:
            ax.axis("off")
            continue
        name = head_names[n] if head_names is not None else f"head {n}"
        plot_attention(weights[n], query_labels, key_labels, ax=ax, title=name,
                       colorbar=False, vmax=vmax)
        if n % ncols:
            ax.set_ylabel("")
        if n < h - ncols:
            ax.set_xlabel("")
    im = axes.flat[0].images[0]
    fig.colorbar(im, ax=axes, label="weight", shrink=0.8)
    fig.suptitle(title)
    return fig
