"""Tests for attention/plotting.py and attention/notebook.py."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from attention import (
    causal_mask,
    plot_attention,
    plot_heads,
    plot_mask,
    setup_notebook,
    use_course_style,
)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_plot_attention_labels_axes_and_adds_a_colour_bar():
    w = torch.softmax(torch.randn(3, 4), -1)
    ax = plot_attention(w, ["a", "b", "c"], ["w", "x", "y", "z"], title="T")
    assert ax.get_title() == "T"
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel().startswith("query")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar
    assert ax.figure.axes[1].get_ylabel() == "weight"


def test_plot_attention_rejects_bad_input():
    with pytest.raises(ValueError, match=r"must be a 2-D \(i, j\) matrix, got shape \(2, 3, 4\)"):
        plot_attention(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="got 2 labels for an axis of size 3"):
        plot_attention(torch.zeros(3, 3), ["a", "b"])


def test_plot_heads_draws_one_panel_per_head_with_one_colour_bar():
    fig = plot_heads(torch.rand(5, 3, 3), ncols=3)
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert len(heatmaps) == 5
    assert [ax.get_ylabel() for ax in fig.axes if ax not in heatmaps and ax.axison] == ["weight"]
    assert fig._suptitle.get_text() == "Attention weights per head"
    with pytest.raises(ValueError, match=r"must be \(h, i, j\)"):
        plot_heads(torch.rand(3, 3))


def test_plot_mask_draws_the_mask():
    ax = plot_mask(causal_mask(4))
    assert ax.images[0].get_array().tolist() == causal_mask(4).double().tolist()
    assert all(s.get_visible() for s in ax.spines.values())


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
