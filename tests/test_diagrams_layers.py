"""The diagrams of the Attention layers part (attention/course/diagrams/layers.py).

``tests/test_diagrams.py`` checks every diagram's size, title and fonts; here the
numbers and shapes each one prints are read back from its text artists (by their
``gid``) and compared with an independent computation (torch's own functions, or the
same layer run another way).
"""

from __future__ import annotations

import math
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from matplotlib.lines import Line2D
from matplotlib.text import Text

from attention import MultiHeadAttention, use_course_style
from attention.course import diagrams
from attention.course.diagrams.layers import permutation_example


@pytest.fixture(autouse=True)
def style_and_close():
    use_course_style()
    yield
    plt.close("all")


def by_gid(fig, kind=Text) -> dict[str, object]:
    return {a.get_gid(): a for a in fig.findobj(kind) if a.get_gid()}


def shown(fig, name: str, rows: int, cols: int) -> list[list[str]]:
    texts = by_gid(fig)
    return [
        [texts[f"{name}[{r},{c}]"].get_text() for c in range(cols)] for r in range(rows)
    ]


def formatted(matrix, fmt: str) -> list[list[str]]:
    def one(v):
        text = fmt.format(float(v))
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    return [[one(v) for v in row] for row in matrix]


def test_the_layers_diagrams_are_listed():
    for name in (
        "permutation_equivariance",
        "split_merge_heads",
        "grouped_query_heads",
        "kv_cache_growth",
        "position_schemes",
        "rope_rotation",
    ):
        assert name in diagrams.__all__


def test_permutation_equivariance_prints_the_heads_weights_and_outputs():
    fig = diagrams.permutation_equivariance()
    tokens, x, perm, head = permutation_example()
    wq, wk, wv = (m.weight.detach() for m in (head.w_query, head.w_key, head.w_value))

    def attend(t):  # softmax(Q K^T / sqrt(d)) V by hand
        q, k, v = t @ wq.T, t @ wk.T, t @ wv.T
        a = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
        return a, a @ v

    a, z = attend(x)
    ap, zp = attend(x[perm])
    assert shown(fig, "A", 3, 3) == formatted(a, "{:.2f}")
    assert shown(fig, "Z", 3, 2) == formatted(z, "{:.2f}")
    assert shown(fig, "PA", 3, 3) == formatted(ap, "{:.2f}")
    assert shown(fig, "PZ", 3, 2) == formatted(zp, "{:.2f}")
    # what the picture claims: the same numbers, moved with the tokens
    assert shown(fig, "PA", 3, 3) == formatted(a[perm][:, perm], "{:.2f}")
    assert shown(fig, "PZ", 3, 2) == formatted(z[perm], "{:.2f}")


def test_split_merge_heads_shows_where_each_number_goes():
    fig = diagrams.split_merge_heads()
    x = torch.arange(12.0, dtype=torch.float64).reshape(2, 6)  # 2 tokens, 3 heads of 2
    assert shown(fig, "x", 2, 6) == formatted(x, "{:.0f}")
    outs = []
    for n in range(3):
        head = x[:, 2 * n : 2 * n + 2]  # the contiguous features of head n
        assert shown(fig, f"head{n}", 2, 2) == formatted(head, "{:.0f}")
        out = F.scaled_dot_product_attention(head / 4, head / 4, head)
        assert shown(fig, f"out{n}", 2, 2) == formatted(out, "{:.1f}")
        outs.append(out)
    assert shown(fig, "merged", 2, 6) == formatted(torch.cat(outs, dim=-1), "{:.1f}")
    texts = by_gid(fig)
    assert texts["shape:x"].get_text().endswith("= (1, 2, 6)")
    assert texts["shape:heads"].get_text().endswith("= (1, 3, 2, 2)")
    assert texts["shape:merged"].get_text().endswith("= (1, 2, 6)")


def test_grouped_query_heads_draws_each_query_heads_group_and_the_cache():
    fig = diagrams.grouped_query_heads()
    lines = by_gid(fig, Line2D)
    texts = by_gid(fig)
    for name, h_kv in (("MHA", 8), ("GQA", 2), ("MQA", 1)):
        drawn = sorted(
            tuple(int(n) for n in re.fullmatch(rf"{name}:q(\d+)->kv(\d+)", g).groups())
            for g in lines
            if g.startswith(f"{name}:")
        )
        assert drawn == [(n, n // (8 // h_kv)) for n in range(8)], name
        kib = (
            2 * h_kv * 128 * 2 / 1024
        )  # a key and a value of 128 fp16 numbers per head
        assert texts[f"bytes:{name}"].get_text().startswith(f"cache: {kib:g} KiB"), name
        assert texts[f"title:{name}"].get_text() == f"{name}: h_kv = {h_kv}"


def test_kv_cache_growth_prints_the_lengths_and_the_newest_querys_weights():
    fig = diagrams.kv_cache_growth()
    texts = by_gid(fig)
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2, num_kv_heads=1).eval()
    x = torch.randn(1, 5, 8)
    with torch.no_grad():  # the whole sequence at once, no cache
        _, w = layer(x, x, x, is_causal=True, need_weights=True)  # (1, 2, 5, 5)
    for s, length in enumerate((3, 4, 5)):
        assert texts[f"length{s}"].get_text() == f"cache length {length}/5"
        row = w[0, 0, length - 1, :length]  # the newest query, over the keys so far
        assert shown(fig, f"weights{s}", 1, length) == formatted(row[None], "{:.1f}")


# =========================================================================== chapter 7


@pytest.mark.slow  # draws figures: make test, not make check
def test_rope_rotation_prints_the_frequencies_and_draws_the_rotated_pairs():
    d, base, m = 8, 100.0, 4
    fig = diagrams.rope_rotation(d=d, base=base, position=m)
    texts, lines = by_gid(fig), by_gid(fig, Line2D)
    q = torch.randn(d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for k in range(d // 2):
        theta = base ** (-2 * k / d)  # written out, not from the package
        assert texts[f"theta[{k}]"].get_text() == f"θ = {theta:.2f}"
        assert texts[f"angle[{k}]"].get_text() == f"{m}θ = {m * theta:.2f} rad"
        period = f"turn: {2 * math.pi / theta:.0f} positions"
        assert texts[f"period[{k}]"].get_text() == period
        # the coloured vector points where a rotation by m theta takes the pair
        x, y = float(q[2 * k]), float(q[2 * k + 1])
        c, s = math.cos(m * theta), math.sin(m * theta)
        expected = math.atan2(x * s + y * c, x * c - y * s)
        for gid, angle in ((f"rotated[{k}]", expected), (f"start[{k}]", None)):
            (x0, y0), (x1, y1) = lines[gid].get_xydata()
            drawn = math.atan2(y1 - y0, x1 - x0)
            want = math.atan2(y, x) if angle is None else angle
            assert abs(math.remainder(drawn - want, 2 * math.pi)) < 1e-9, gid
    with pytest.raises(ValueError, match="d = 8"):
        diagrams.rope_rotation(d=6)


def test_position_schemes_prints_alibis_bias_of_one_head():
    fig = diagrams.position_schemes()
    expected = [[f"{-abs(i - j) / 2:g}" for j in range(4)] for i in range(4)]
    assert shown(fig, "bias", 4, 4) == expected


# =========================================================================== chapter 8


def test_cross_attention_diagram_prints_the_layers_weights_and_outputs():
    from attention.course.diagrams.layers import cross_example

    fig = diagrams.encoder_decoder_cross_attention()
    source, target, memory, states, layer = cross_example()
    wq, wk, wv = (
        m.weight.detach() for m in (layer.w_query, layer.w_key, layer.w_value)
    )
    q, k, v = states @ wq.T, memory @ wk.T, memory @ wv.T
    a = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    assert shown(fig, "A", 3, 5) == formatted(a, "{:.2f}")
    assert shown(fig, "Z", 3, 2) == formatted(a @ v, "{:.2f}")
    assert by_gid(fig)["shape:Z"].get_text().endswith("(3, 2)")
    labels = {t.get_text() for t in fig.findobj(Text)}
    assert set(source) | set(target) <= labels


def test_learned_queries_diagram_prints_the_blocks_weights():
    from attention.course.diagrams.layers import latent_example

    fig = diagrams.learned_queries_summary()
    layer, small, large = latent_example()
    a = layer.attn
    q = layer.latents.detach() @ a.w_query.weight.detach().T + a.w_query.bias.detach()
    for gid, x in (("A0", small), ("A1", large)):
        k = x[0] @ a.w_key.weight.detach().T + a.w_key.bias.detach()
        w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
        assert shown(fig, gid, 3, x.shape[1]) == formatted(w, "{:.1f}")
    texts = by_gid(fig)
    assert texts["shape:Z0"].get_text() == texts["shape:Z1"].get_text() == "(3, 4)"


# =========================================================================== chapter 9


def test_alignment_kinds_prints_the_packages_weights():
    from attention.course.diagrams.layers import alignment_example

    fig = diagrams.alignment_kinds()
    scores, sample, centre, half = alignment_example()
    soft = torch.softmax(scores, -1)
    assert shown(fig, "scores", 1, 8) == formatted(scores, "{:.1f}")
    assert shown(fig, "soft", 1, 8) == formatted(soft, "{:.2f}")
    hard = shown(fig, "hard", 1, 8)[0]
    assert hard.count("1.00") == 1 and hard.index("1.00") == sample
    # local: the softmax over the window |l - p| <= D, times the Gaussian (sigma = D/2)
    pos = torch.arange(8, dtype=torch.float64)
    inside = (pos - centre).abs() <= half
    window = torch.softmax(scores[0].masked_fill(~inside, -math.inf), -1)
    local = window * torch.exp(-((pos - centre) ** 2) / (2 * (half / 2) ** 2))
    assert shown(fig, "local", 1, 8) == formatted(local[None], "{:.2f}")


def test_additive_vs_dot_prints_the_shapes():
    from attention.course.diagrams.layers import additive_example

    fig = diagrams.additive_vs_dot()
    q, k, score = additive_example()
    h = score.w_query.shape[0]
    texts = by_gid(fig)
    i, j = q.shape[0], k.shape[0]
    assert texts["shape:dot"].get_text() == f"scores ({i}, {j})"
    assert texts["shape:hidden"].get_text() == f"tanh(sum) ({i}, {j}, {h})"
    assert texts["shape:additive"].get_text() == f"scores ({i}, {j})"
