"""The last part's diagrams (chapters 19-20) show what the package computes.

tests/test_diagrams.py checks every diagram's size, title and fonts; here the numbers
each diagram prints are read back (by their ``gid``) and compared with an independent
computation: a head's circuits from its weight matrices sliced by hand, the induction
key found by a loop over the tokens, softmax and a sort-based sparsemax written out,
and the difference of two softmax rows.
"""

from __future__ import annotations

import math
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.text import Text

from attention import use_course_style
from attention.course.diagrams import reading


@pytest.fixture(autouse=True)
def style_and_close():
    use_course_style()
    yield
    plt.close("all")


def texts(fig) -> dict[str, str]:
    return {t.get_gid(): t.get_text() for t in fig.findobj(Text) if t.get_gid()}


def two_decimals(x: float) -> str:
    text = f"{x:.2f}"
    return text[1:] if text == "-0.00" else text


# --------------------------------------------------------------------------- chapter 19


def test_head_circuits_prints_the_size_and_rank_of_a_heads_circuits():
    fig = reading.head_circuits()
    layer, _, _ = reading.circuit_example()
    big_d, d = layer.embed_dim, layer.head_dim
    # head 0's slices of the projections, as nn.Linear stores them: (out, in)
    w_q = layer.w_query.weight[:d].T.detach()  # (D, d)
    w_k = layer.w_key.weight[:d].T.detach()
    w_v = layer.w_value.weight[:d].T.detach()
    w_o = layer.w_out.weight[:, :d].T.detach()  # (d, D)
    shown = texts(fig)
    for gid, circuit in (("rank:qk", w_q @ w_k.T), ("rank:ov", w_v @ w_o)):
        rank = int(torch.linalg.matrix_rank(circuit))
        assert rank == d
        assert f"({big_d}, {big_d}), rank {rank} = d" in shown[gid], shown[gid]
    assert shown["sizes"] == f"D = {big_d} (model size), d = {d} (head size)"


def test_induction_circuit_points_at_the_token_after_the_earlier_copy():
    fig = reading.induction_circuit()
    tokens = reading.INDUCTION_TOKENS
    last = len(tokens) - 1
    earlier = max(k for k in range(last) if tokens[k] == tokens[last])
    key = earlier + 1
    assert reading.induction_key() == key
    arcs = [
        a.get_gid() for a in fig.findobj() if (a.get_gid() or "").startswith("key:")
    ]
    assert f"key:induction[{key}]" in arcs
    line = texts(fig)["key:induction"]
    assert line.startswith(
        f"key {key} matches: its previous token is {tokens[key - 1]}"
    )


def test_induction_key_refuses_a_sequence_without_a_repeat():
    with pytest.raises(ValueError, match="no earlier copy"):
        reading.induction_key(("a", "b", "c"))


# --------------------------------------------------------------------------- chapter 20


def sorted_sparsemax(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax of one row by Martins and Astudillo's algorithm, in a loop."""
    ordered = sorted(z.tolist(), reverse=True)
    total, kept, tau = 0.0, 0, 0.0
    for k, value in enumerate(ordered, start=1):
        total += value
        if 1 + k * value > total:
            kept, tau = k, (total - 1) / k
    assert kept > 0
    return torch.clamp(z - tau, min=0)


def test_simplex_projections_print_softmax_and_sparsemax_of_the_scores():
    fig = reading.simplex_projections()
    shown = texts(fig)
    for name, scores in reading.SIMPLEX_SCORES.items():
        z = torch.tensor(scores, dtype=torch.float64)
        rows = {
            0: z,
            1: torch.exp(z) / torch.exp(z).sum(),
            2: sorted_sparsemax(z),
        }
        for r, values in rows.items():
            for c in range(3):
                assert shown[f"table:{name}[{r},{c}]"] == two_decimals(float(values[c]))
        # sparsemax lands on the rim: one key at 0 on an edge, two at a corner
        assert int((rows[2] == 0).sum()) >= 1 and bool((rows[1] > 0).all())


def test_the_sparsemax_points_are_the_orthogonal_projections():
    found = reading.simplex_example()
    for maps in found.values():
        plane, sparse = maps["plane"], maps["sparsemax"]
        # the nearest point of the simplex: no distribution is closer to the scores
        grid = torch.linspace(0, 1, 101, dtype=torch.float64)
        a, b = torch.meshgrid(grid, grid, indexing="ij")
        inside = (a + b) <= 1
        points = torch.stack([a[inside], b[inside], 1 - a[inside] - b[inside]], -1)
        nearest = (points - plane).norm(dim=-1).min()
        assert (sparse - plane).norm() <= nearest + 1e-12


def test_differential_maps_print_the_two_rows_and_their_difference():
    fig = reading.differential_maps()
    map1, map2, lam, _ = reading.differential_example()
    assert torch.allclose(map1.sum(), torch.tensor(1.0, dtype=torch.float64))
    difference = map1 - lam * map2
    shown = texts(fig)
    for gid, row in (
        ("map1", map1),
        ("map2", map2),
        ("scaled", lam * map2),
        ("difference", difference),
    ):
        for k in range(row.shape[0]):
            assert shown[f"{gid}[0,{k}]"] == two_decimals(float(row[k])), (gid, k)
    total = float(difference.sum())
    assert math.isclose(total, 1 - lam, abs_tol=1e-12)
    numbers = re.findall(r"-?\d\.\d\d", shown["sums"])
    assert numbers[:2] == [f"{total:.2f}", f"{float(difference[2]):.2f}"]
    # the distractors nearly cancel: far less weight than in map 1
    others = float(difference.sum() - difference[2])
    assert abs(others) < 0.25 * float(map1.sum() - map1[2])
