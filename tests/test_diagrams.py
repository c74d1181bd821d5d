"""The conceptual diagrams, attention/course/diagrams: built, sized, readable, and true.

Every diagram listed in ``attention.course.diagrams.__all__`` builds, has a title, fits
the 750 px column once cropped as a notebook stores it, keeps its text inside its card
and no smaller than 8 pt. The numbers and shapes a diagram prints are read back from its
text artists (by their ``gid``) and compared with an independent computation.
"""

from __future__ import annotations

import functools
import io
import math
import re
import struct

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from attention import use_course_style
from attention.course import diagrams
from attention.course.diagrams import _draw
from attention.course.diagrams.foundations import tiny_example

COLUMN_CSS_PX = 750


@pytest.fixture(autouse=True)
def style_and_close():
    use_course_style()
    yield
    plt.close("all")


def texts(fig) -> list[Text]:
    return [
        t
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_figure() is fig
    ]


def by_gid(fig, kind=Text) -> dict[str, object]:
    return {a.get_gid(): a for a in fig.findobj(kind) if a.get_gid()}


def rendered_png_width(fig) -> int:
    """Width in pixels of the PNG a notebook stores at 100 dpi (cropped as inline)."""
    buffer = io.BytesIO()
    fig.savefig(
        buffer,
        format="png",
        dpi=100,
        bbox_inches="tight",
        pad_inches=plt.rcParams["savefig.pad_inches"],
    )
    return struct.unpack(">I", buffer.getvalue()[16:20])[0]


#: Public names of the diagram modules that return the numbers a diagram draws, for a
#: chapter's check, rather than a figure.
DATA = {"alignment_vectors"}


FIGURES = [name for name in diagrams.__all__ if name not in DATA]


@pytest.fixture(params=FIGURES)
def figure(request):
    """A diagram built afresh, for the tests that draw it."""
    return getattr(diagrams, request.param)()


@functools.cache
def _built_once(name):
    return getattr(diagrams, name)()


@pytest.fixture(params=FIGURES)
def built(request):
    """A diagram built once per test process, for the tests that only read it."""
    return _built_once(request.param)


@pytest.mark.slow  # builds every diagram: make test, not make check
def test_every_diagram_builds_a_titled_figure(built):
    assert isinstance(built, matplotlib.figure.Figure)
    assert built.get_suptitle().strip()


@pytest.mark.slow  # renders figures: make test, not make check
def test_every_diagram_fits_the_column(figure):
    assert figure.get_size_inches()[0] <= 7.5
    assert rendered_png_width(figure) <= COLUMN_CSS_PX


@pytest.mark.slow  # builds every diagram: make test, not make check
def test_no_text_is_smaller_than_8_points(built):
    for t in texts(built):
        size = t.get_fontsize()
        if re.search(r"\$[^$]*[_^][^$]*\$", t.get_text()):
            size *= 0.7  # a mathtext sub- or superscript is drawn at 70 %
        assert size >= 8, f"{t.get_text()!r} is drawn at {size:.1f} pt"


@pytest.mark.slow  # renders figures: make test, not make check
def test_every_text_lies_inside_the_card(figure):
    figure.canvas.draw()  # lays out the colour bars' labels
    renderer = figure.canvas.get_renderer()
    width, height = figure.get_size_inches() * figure.dpi
    for t in texts(figure):
        box = t.get_window_extent(renderer)
        inside = box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height
        assert inside, f"{t.get_text()!r} sticks out of the diagram: {box}"


def test_the_canvas_refuses_a_figure_wider_than_the_column():
    with pytest.raises(ValueError, match="at most 7.4 inches wide, got 8"):
        _draw.canvas(8, 3, "too wide")


# --------------------------------------------------------------------------- numbers


def printed(fig, gid: str) -> str:
    return by_gid(fig)[gid].get_text()


def two_decimals(x: float) -> str:
    text = f"{x:.2f}"
    return text[1:] if text == "-0.00" else text


def test_scores_to_output_prints_the_packages_numbers():
    """Scores, weights, values and output as torch computes them from the inputs."""
    fig = diagrams.scores_to_output()
    tokens, q, k, v = tiny_example()
    scores = q @ k.T / math.sqrt(q.shape[-1])
    expected = {
        "scores": scores,
        "weights": torch.softmax(scores, dim=-1),
        "values": v,
        "output": F.scaled_dot_product_attention(q, k, v),
    }
    for name, matrix in expected.items():
        for r in range(matrix.shape[0]):
            for c in range(matrix.shape[1]):
                shown = printed(fig, f"{name}[{r},{c}]")
                assert shown == two_decimals(float(matrix[r, c])), (name, r, c, shown)
    weights = expected["weights"]
    sum_line = printed(fig, "sum")
    assert [float(w) for w in re.findall(r"(\d\.\d\d)·v", sum_line)] == [
        round(float(w), 2) for w in weights[1]
    ]
    assert sum_line.startswith(f"o({tokens[1]}) = ")


@pytest.mark.slow  # renders figures: make test, not make check
def test_mask_broadcast_shows_the_broadcast_shapes_and_masks():
    fig = diagrams.mask_broadcast()
    batch, heads, n = 2, 2, 4
    lengths = torch.tensor([4, 2])
    padding = (torch.arange(n) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    causal = (torch.arange(n)[None, :] <= torch.arange(n)[:, None])[None, None]
    shapes = {
        "shape:padding": tuple(padding.shape),
        "shape:causal": tuple(causal.shape),
        "shape:broadcast": (batch, heads, n, n),
    }
    for gid, shape in shapes.items():
        assert printed(fig, gid).endswith(f"= {shape}"), gid
    cells = by_gid(fig, Rectangle)
    combined = (padding & causal).expand(batch, heads, n, n)
    for b in range(batch):
        for h in range(heads):
            for r in range(n):
                for c in range(n):
                    fill = cells[f"mask[{b},{h}][{r},{c}]"].get_facecolor()
                    dark = fill == matplotlib.colors.to_rgba(_draw.MAY_ATTEND)
                    assert dark == bool(combined[b, h, r, c]), (b, h, r, c)


def test_qkv_projection_draws_grids_of_the_projections_shapes():
    fig = diagrams.qkv_projection()
    cells = by_gid(fig, Rectangle)

    def grid(name):
        found = [re.fullmatch(rf"{name}\[(\d+),(\d+)\]", g) for g in cells]
        rows_cols = [(int(m[1]), int(m[2])) for m in found if m]
        return (max(r for r, _ in rows_cols) + 1, max(c for _, c in rows_cols) + 1)

    n, d_model, d, e = 4, 5, 3, 2
    assert grid("X") == (n, d_model)
    assert grid("W_Q") == grid("W_K") == (d_model, d) and grid("W_V") == (d_model, e)
    assert grid("Q") == grid("K") == (n, d) and grid("V") == (n, e)
    shown = {t.get_text() for t in texts(fig)}
    assert {"(n, d_model)", "(d_model, d)", "(d_model, e)", "(n, d)", "(n, e)"} <= shown


# --------------------------------------------------------------------------- primitives


def test_the_primitives_place_what_they_draw_where_they_say():
    fig, ax = _draw.canvas(7.2, 3.0, "primitives")
    m = _draw.matrix(
        ax,
        (1.2, 1.4),
        3,
        4,
        cell=0.3,
        name="K",
        shape="(j, d)",
        values=[[0, -0.001, 1, 2]] * 3,
        gid="m",
    )
    assert (m.left, m.bottom, m.width, m.height) == pytest.approx((0.6, 0.95, 1.2, 0.9))
    assert m.east == pytest.approx((1.8, 1.4)) and m.north == pytest.approx((1.2, 1.85))
    assert printed(fig, "m[0,1]") == "0.00"  # never "-0.00"
    b = _draw.box(ax, (3.3, 1.6), "softmax\nper row")
    assert b.centre == pytest.approx((3.3, 1.6)) and b.height > 0.34  # two lines
    patch = _draw.arrow(ax, m.east, b.west, text="scores")
    assert patch.get_path() is not None and "scores" in {
        t.get_text() for t in texts(fig)
    }
    _draw.brace(ax, (0.6, 0.5), (1.8, 0.5), "4 columns", side="below")
    _draw.bracket(ax, (4.3, 2.2), (5.5, 2.2), "a bracket", side="above")
    fig.canvas.draw()
    shown = {t.get_text(): t for t in texts(fig)}
    assert (
        shown["4 columns"].get_position()[1]
        < 0.5
        < shown["a bracket"].get_position()[1]
    )
    h = _draw.heatmap(ax, (5.0, 1.2), [[0.1, 0.9], [0.5, 0.5]], cell=0.4, gid="h")
    bars = ax.child_axes  # inset axes in inches
    assert len(bars) == 1 and bars[0].get_ylabel() == "weight"  # the colour bar
    assert bars[0].get_position().x0 * 7.2 > h.right  # beside the tile, not over it
    assert _draw.ink_on("#ffffff") == _draw.INK and _draw.ink_on("#000000") == "white"
    assert _draw.tint("#000000", 0.25) == pytest.approx((0.75, 0.75, 0.75))


# --------------------------------------------------------------- chapters 1-4 (numbers)


@pytest.mark.slow  # renders figures: make test, not make check
def test_vector_alignment_prints_the_three_dot_products():
    from attention.course.diagrams.foundations import alignment_vectors

    fig = diagrams.vector_alignment()
    pairs = alignment_vectors()
    signs = {"aligned": 1, "orthogonal": 0, "opposite": -1}
    for name, (q, k) in pairs.items():
        score = float((q * k).sum())  # the sum of products, without the package
        cos = score / float(q.norm() * k.norm())
        assert math.isclose(cos, signs[name], abs_tol=1e-6), name
        shown = printed(fig, f"score:{name}")
        assert shown == ("q · k = 0" if signs[name] == 0 else f"q · k = {score:+.2f}")


@pytest.mark.slow  # renders figures: make test, not make check
def test_score_matrix_prints_every_dot_product_and_the_followed_sum():
    from attention.course.diagrams.foundations import score_matrix_example

    fig = diagrams.score_matrix(i=1, j=3)
    q, k = score_matrix_example()
    for r in range(q.shape[0]):
        for c in range(k.shape[0]):
            loop = sum(float(a * b) for a, b in zip(q[r], k[c]))
            assert printed(fig, f"S[{r},{c}]") == f"{loop:.0f}", (r, c)
    for r in range(k.shape[1]):
        for c in range(k.shape[0]):
            assert printed(fig, f"KT[{r},{c}]") == f"{float(k[c, r]):.0f}"
    line = printed(fig, "sum")
    products = re.findall(r"\(?(-?\d)\)?·\(?(-?\d)\)?", line)
    assert [(int(a), int(b)) for a, b in products] == [
        (int(a), int(b)) for a, b in zip(q[1], k[3])
    ]
    assert line.endswith(f"= {float(q[1] @ k[3]):.0f}")


@pytest.mark.slow  # renders figures: make test, not make check
def test_softmax_steps_prints_exp_sum_and_weights():
    from attention.course.diagrams.foundations import SOFTMAX_SCORES

    fig = diagrams.softmax_steps()
    z = torch.tensor(SOFTMAX_SCORES, dtype=torch.float64)
    e = torch.exp(z)
    for c in range(len(z)):
        assert printed(fig, f"z[0,{c}]") == two_decimals(float(z[c]))
        assert printed(fig, f"exp[0,{c}]") == two_decimals(float(e[c]))
        assert printed(fig, f"weights[0,{c}]") == two_decimals(float(e[c] / e.sum()))
    assert printed(fig, "sum") == f"sum = {float(e.sum()):.2f}"


@pytest.mark.slow  # renders figures: make test, not make check
def test_max_shift_shows_the_overflow_and_the_shifted_weights():
    from attention.course.diagrams.foundations import LARGE_SCORES

    fig = diagrams.max_shift()
    z = torch.tensor(LARGE_SCORES, dtype=torch.float32)
    for c in range(len(z)):
        assert printed(fig, f"naive:exp[0,{c}]") == "inf"
        assert printed(fig, f"naive:weights[0,{c}]") == "nan"
        assert printed(fig, f"shift:z[0,{c}]") == f"{float(z[c] - z.max()):.0f}"
    expected = torch.softmax(z.double(), -1)
    shown = [printed(fig, f"shift:weights[0,{c}]") for c in range(len(z))]
    assert shown == [two_decimals(float(w)) for w in expected]
    assert printed(fig, "reference").endswith(", ".join(shown))


@pytest.mark.slow  # renders figures: make test, not make check
def test_dot_product_variance_prints_the_sum_and_measured_variances():
    from attention.course.diagrams.foundations import variance_example, variance_table

    fig = diagrams.dot_product_variance()
    q, k = variance_example()
    for c in range(8):
        assert printed(fig, f"q[0,{c}]") == f"{float(q[0, c]):.1f}".replace(
            "-0.0", "0.0"
        )
        product = f"{float(q[0, c] * k[0, c]):.1f}".replace("-0.0", "0.0")
        assert printed(fig, f"qk[0,{c}]") == product
    score = sum(float(a * b) for a, b in zip(q[0], k[0]))
    assert printed(fig, "score") == f"sum: q · k = {score:.2f}"
    table = variance_table()
    g = torch.Generator().manual_seed(0)
    for d, (raw, scaled) in table.items():
        qs = torch.randn(4000, d, generator=g, dtype=torch.float64)
        ks = torch.randn(4000, d, generator=g, dtype=torch.float64)
        dots = (qs * ks).sum(-1)  # the sum of products, without the package
        assert math.isclose(raw, float(dots.var()), rel_tol=1e-9)
        assert abs(raw / d - 1) < 0.1 and abs(scaled - 1) < 0.1
        assert printed(fig, f"var:{d}") == f"{raw:.1f}"
        assert printed(fig, f"scaled:{d}") == f"{scaled:.2f}"


@pytest.mark.slow  # renders figures: make test, not make check
def test_scaling_rows_prints_softmax_rows_with_and_without_the_scale():
    from attention.course.diagrams.foundations import SCALING_DIMS, scaling_rows_example

    fig = diagrams.scaling_rows()
    for d in SCALING_DIMS:
        q, k = scaling_rows_example(d)
        raw = (q * k).sum(-1)  # (8,) the scores of the one query, without the package
        for tag, scores in (("raw", raw), ("scaled", raw / math.sqrt(d))):
            weights = torch.softmax(scores, -1)
            shown = [printed(fig, f"{tag}:{d}[0,{c}]") for c in range(8)]
            assert shown == [two_decimals(float(w)) for w in weights], (tag, d)
            low, high = float(scores.min()), float(scores.max())
            assert printed(fig, f"range:{tag}:{d}") == (
                f"scores from {low:.1f} to {high:.1f}"
            )
    # the point of the figure: one-hot without the scale at d_k = 1024, not with it
    q, k = scaling_rows_example(1024)
    raw = (q * k).sum(-1)
    assert torch.softmax(raw, -1).max() > 0.99 > torch.softmax(raw / 32, -1).max()


@pytest.mark.slow  # renders figures: make test, not make check
def test_causal_triangle_prints_scores_minus_inf_and_zero_weights_above_the_diagonal():
    from attention.course.diagrams.foundations import causal_example

    fig = diagrams.causal_triangle()
    _, q, k = causal_example()
    scores = q @ k.T / math.sqrt(q.shape[-1])
    n = scores.shape[0]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)  # True above the diagonal
    weights = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    for r in range(n):
        for c in range(n):
            assert printed(fig, f"scores[{r},{c}]") == two_decimals(float(scores[r, c]))
            masked = "-inf" if c > r else two_decimals(float(scores[r, c]))
            assert printed(fig, f"masked[{r},{c}]") == masked
            assert printed(fig, f"weights[{r},{c}]") == two_decimals(
                float(weights[r, c])
            )
    assert printed(fig, "weights[0,0]") == "1.00"


@pytest.mark.slow  # renders figures: make test, not make check
def test_cache_mask_draws_the_bottom_right_and_the_top_left_masks():
    from attention.course.diagrams.foundations import CACHED, NEW

    fig = diagrams.cache_mask()
    cells = by_gid(fig, Rectangle)
    dark = matplotlib.colors.to_rgba(_draw.MAY_ATTEND)
    total = CACHED + NEW
    for r in range(NEW):
        for c in range(total):
            right = cells[f"right[{r},{c}]"].get_facecolor() == dark
            wrong = cells[f"wrong[{r},{c}]"].get_facecolor() == dark
            # new query r at absolute position CACHED + r sees keys 0 .. CACHED + r
            assert right == (c <= CACHED + r), (r, c)
            # is_causal=True: query r sees keys 0 .. r
            assert wrong == (c <= r), (r, c)
