"""Tests for attention/course/plotting.py and attention/course/notebook.py."""

import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from attention import (
    causal_mask,
    plot_attention,
    plot_grid,
    plot_heads,
    plot_mask,
    setup_notebook,
    use_course_style,
)
from attention.course.plotting import MAX_FIGURE_WIDTH, MAX_TICKS
from attention.foundations.masks import decoding_mask

ROOT = Path(__file__).resolve().parents[1]
COLUMN_CSS_PX = 750  # the book's content column


@pytest.fixture(autouse=True)
def close_figures():
    use_course_style()
    yield
    plt.close("all")


def heatmaps(fig):
    return [ax for ax in fig.axes if ax.images]


def colour_bars(fig):
    return [ax for ax in fig.axes if not ax.images and ax.axison and ax.get_ylabel()]


def tick_values(axis):
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo <= t <= hi]


def test_plot_attention_labels_axes_and_adds_a_colour_bar():
    w = torch.softmax(torch.randn(3, 4), -1)
    ax = plot_attention(w, ["a", "b", "c"], ["w", "x", "y", "z"], title="T")
    assert ax.get_title() == "T"
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar
    assert ax.figure.axes[1].get_ylabel() == "weight"


def test_plot_attention_rejects_bad_input():
    with pytest.raises(
        ValueError, match=r"must be a 2-D \(i, j\) matrix, got shape \(2, 3, 4\)"
    ):
        plot_attention(torch.zeros(2, 3, 4))
    with pytest.raises(
        ValueError,
        match="query_labels must have one label per position: 3 positions, got 2",
    ):
        plot_attention(torch.zeros(3, 3), ["a", "b"])
    with pytest.raises(
        TypeError, match="weights must be a tensor or an array of numbers, got NoneType"
    ):
        plot_attention(None)
    with pytest.raises(
        TypeError, match="mask must be a tensor or an array of numbers, got NoneType"
    ):
        plot_mask(None)
    with pytest.raises(ValueError, match="meta tensor: it has a shape but no values"):
        plot_attention(torch.zeros(3, 3, device="meta"))
    with pytest.raises(
        TypeError,
        match="query_labels must be a sequence of strings, one per position, "
        "got Tensor",
    ):
        plot_attention(
            torch.zeros(3, 3), torch.ones(3, 3, dtype=torch.bool)
        )  # a mask in the labels' place
    with pytest.raises(TypeError, match="key_labels must be a sequence of strings"):
        plot_attention(torch.zeros(3, 3), key_labels="abc")
    with pytest.raises(
        TypeError, match="weights must be a tensor or an array of numbers, got str"
    ):
        plot_attention("weights")


@pytest.mark.slow  # draws figures: make test, not make check
@pytest.mark.parametrize(
    "n",
    [2, 8, 64, 300],
)
def test_figure_sizes_are_capped_whatever_the_matrix_size(n):
    for fig in (
        plot_attention(torch.rand(n, n)).figure,
        plot_mask(causal_mask(n)).figure,
        plot_grid([torch.rand(n, n)] * 3),
        plot_heads(torch.rand(7, n, n)),
    ):
        w, h = fig.get_size_inches()
        assert w <= MAX_FIGURE_WIDTH + 1e-9 and h <= 11.0, (n, w, h)
    small_w, small_h = plot_attention(torch.rand(2, 2)).figure.get_size_inches()
    assert small_w <= 4.5 and small_h <= 3.5  # a 2 x 2 matrix is not drawn a foot wide


def test_weights_default_to_a_zero_one_scale_and_other_data_to_its_own_range():
    ax = plot_attention(torch.full((3, 3), 0.2))  # weights that never exceed 0.2
    assert ax.images[0].get_clim() == (0.0, 1.0)
    ax = plot_attention(torch.tensor([[-3.0, 1.0], [2.0, 5.0]]))  # scores: not clipped
    assert ax.images[0].get_clim() == (-3.0, 5.0)
    ax = plot_attention(torch.rand(3, 3), vmin=-1.0, vmax=1.0)
    assert ax.images[0].get_clim() == (-1.0, 1.0)


def test_compared_panels_share_one_scale_and_one_colour_bar():
    low, high = torch.full((4, 4), 0.1), torch.eye(4) * 3.0
    fig = plot_grid([low, high], ["low", "high"], cbar_label="score")
    assert {ax.images[0].get_clim() for ax in heatmaps(fig)} == {(0.0, 3.0)}
    assert [ax.get_ylabel() for ax in colour_bars(fig)] == ["score"]
    fig = plot_heads(torch.softmax(torch.randn(5, 3, 3), -1) * 0.5)
    assert {ax.images[0].get_clim() for ax in heatmaps(fig)} == {(0.0, 1.0)}
    assert len(colour_bars(fig)) == 1


@pytest.mark.slow  # renders figures: make test, not make check
def test_grids_have_at_most_three_panels_per_row():
    fig = plot_heads(torch.rand(12, 4, 4), ncols=4)
    fig.draw_without_rendering()
    lefts = {round(ax.get_position().x0, 3) for ax in heatmaps(fig)}
    assert len(heatmaps(fig)) == 12 and len(lefts) == 3


def test_panels_of_a_grid_line_up_row_for_row():
    fig = plot_grid([causal_mask(8), decoding_mask(3, 5), causal_mask(3, 8)], mask=True)
    fig.draw_without_rendering()
    axes = heatmaps(fig)
    cell_heights = [
        ax.get_window_extent().height / ax.images[0].get_array().shape[0] for ax in axes
    ]
    cell_widths = [
        ax.get_window_extent().width / ax.images[0].get_array().shape[1] for ax in axes
    ]
    assert max(cell_heights) - min(cell_heights) < 0.5  # pixels
    assert max(cell_widths) - min(cell_widths) < 0.5
    assert max(cell_heights) - min(cell_widths) < 0.5  # square cells, not stretched
    assert not colour_bars(fig)  # a mask carries no number


def test_ticks_are_thinned_beyond_sixteen_rows():
    ax = plot_attention(torch.rand(64, 64))
    assert 3 <= len(tick_values(ax.xaxis)) <= MAX_TICKS
    assert 3 <= len(tick_values(ax.yaxis)) <= MAX_TICKS
    labels = [f"t{k}" for k in range(40)]
    ax = plot_attention(torch.rand(40, 40), labels, labels)
    assert (
        len(ax.get_xticklabels()) <= MAX_TICKS
        and ax.get_xticklabels()[0].get_text() == "t0"
    )
    ax = plot_attention(torch.rand(16, 16))
    assert tick_values(ax.xaxis) == list(range(16))


@pytest.mark.parametrize("n", [4, 13, 50])
def test_mask_ticks_are_integer_positions(n):
    fig = plot_grid([causal_mask(n), causal_mask(n)], mask=True)
    fig.draw_without_rendering()
    for ax in [plot_mask(causal_mask(n)), *heatmaps(fig)]:
        for axis in (ax.xaxis, ax.yaxis):
            ticks = tick_values(axis)
            assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_plot_mask_draws_the_mask():
    ax = plot_mask(causal_mask(4))
    assert ax.images[0].get_array().tolist() == causal_mask(4).double().tolist()
    assert all(s.get_visible() for s in ax.spines.values())


def test_annotations_only_on_small_matrices_in_a_font_sized_to_the_cell():
    small = plot_attention(torch.rand(3, 3), annotate=True)
    medium = plot_attention(torch.rand(10, 10), annotate=True)
    large = plot_attention(torch.rand(20, 20), annotate=True)
    assert len(small.texts) == 9 and len(medium.texts) == 100 and not large.texts
    assert small.texts[0].get_fontsize() > medium.texts[0].get_fontsize() >= 8


def test_key_labels_rotate_only_when_they_would_overlap():
    short = plot_attention(torch.rand(3, 3), ["a", "b", "c"], ["a", "b", "c"])
    assert all(t.get_rotation() == 0 for t in short.get_xticklabels())
    words = [
        "attention",
        "mechanism",
        "everywhere",
        "sometimes",
        "elsewhere",
        "whatever",
    ] * 2
    long = plot_attention(torch.rand(12, 12), words, words)
    assert all(t.get_rotation() == 45 for t in long.get_xticklabels())


def test_plot_heads_draws_one_panel_per_head_with_one_colour_bar():
    fig = plot_heads(torch.rand(5, 3, 3), ncols=3)
    assert len(heatmaps(fig)) == 5
    assert [ax.get_ylabel() for ax in colour_bars(fig)] == ["weight"]
    assert fig._suptitle.get_text() == "Attention weights per head"
    with pytest.raises(ValueError, match=r"must be \(h, i, j\)"):
        plot_heads(torch.rand(3, 3))
    with pytest.raises(
        ValueError, match="head_names must have one name per head: 5 heads, got 2 names"
    ):
        plot_heads(torch.rand(5, 3, 3), head_names=["a", "b"])
    with pytest.raises(
        TypeError, match="head_names must be a sequence of strings, got str"
    ):
        plot_heads(torch.rand(5, 3, 3), head_names="abcde")
    with pytest.raises(
        TypeError, match="weights must be a tensor or an array of numbers, got NoneType"
    ):
        plot_heads(None)


def test_plot_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="got 1 titles for 2 matrices"):
        plot_grid([torch.rand(2, 2)] * 2, ["one"])
    with pytest.raises(ValueError, match="ncols must be an int >= 1, got 0"):
        plot_grid([torch.rand(2, 2)], ncols=0)
    with pytest.raises(ValueError, match="at least one matrix"):
        plot_grid([])
    with pytest.raises(ValueError, match=r"must be \(h, i, j\), got shape \(2, 2\)"):
        plot_grid(torch.rand(2, 2))
    for bad in (None, "ab", 3):
        with pytest.raises(
            TypeError,
            match=r"matrices must be a list or tuple of \(i, j\) tensors or an "
            rf"\(h, i, j\) tensor, got {type(bad).__name__}",
        ):
            plot_grid(bad)


def test_setup_notebook_makes_draws_repeatable():
    setup_notebook(seed=3)
    a = torch.randn(4)
    setup_notebook(seed=3)
    assert torch.equal(a, torch.randn(4))
    assert torch.get_num_threads() == 1
    assert "0.1235" in str(torch.tensor([0.123456]))  # four decimals


def test_use_course_style_sets_the_shared_style():
    plt.rcParams["figure.dpi"] = 200
    use_course_style()
    assert plt.rcParams["figure.dpi"] == 100


@pytest.mark.slow  # renders figures: make test, not make check
def test_a_full_width_figure_stays_within_the_column_once_cropped():
    """Inline figures are cropped to their content plus savefig.pad_inches, which must
    not push a 7.5 in figure past the column."""
    from IPython.core.pylabtools import print_figure

    for fig in (
        plot_heads(torch.rand(6, 7, 7)),
        plot_grid([causal_mask(8)] * 3, mask=True),
        plt.subplots(1, 2, figsize=(MAX_FIGURE_WIDTH, 3), constrained_layout=True)[0],
    ):
        png = print_figure(fig, "png", bbox_inches="tight", base64=False)
        assert struct.unpack(">I", png[16:20])[0] <= COLUMN_CSS_PX


TEXT_SIZES = [
    "font.size",
    "axes.titlesize",
    "axes.labelsize",
    "xtick.labelsize",
    "ytick.labelsize",
    "legend.fontsize",
    "legend.title_fontsize",
    "figure.titlesize",
    "figure.labelsize",
]


def test_course_style_sets_every_default_text_size_to_at_least_8_points():
    from matplotlib.font_manager import FontProperties

    plt.rcParams["font.size"] = 6  # a relative size would follow this down
    use_course_style()
    for key in TEXT_SIZES:
        value = plt.rcParams[key]
        assert isinstance(value, (int, float)), (
            f"{key} is {value!r}, not an absolute size"
        )
        assert FontProperties(size=value).get_size_in_points() >= 8, key
    fig, ax = plt.subplots(figsize=(6, 3))
    im = ax.imshow(torch.rand(4, 4).numpy())
    fig.colorbar(im, ax=ax, label="weight")
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(title="legend")
    ax.set(title="title", xlabel="x", ylabel="y")
    ax.annotate("an annotation", (1, 1))
    ax.text(0, 0, "a text")
    fig.suptitle("figure title")
    fig.supxlabel("figure x label")
    fig.canvas.draw()
    texts = [
        t for t in fig.findobj(matplotlib.text.Text) if t.get_text() and t.get_visible()
    ]
    assert len(texts) > 12
    assert min(t.get_fontsize() for t in texts) >= 8


@pytest.mark.slow  # draws figures: make test, not make check
def test_annotations_of_every_annotated_size_are_at_least_8_points():
    for n in range(1, 13):
        ax = plot_attention(torch.rand(n, n), annotate=True)
        assert all(t.get_fontsize() >= 8 for t in ax.texts), n
        plt.close("all")
