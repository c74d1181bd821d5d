"""The Efficient-attention part's diagrams show what the package computes.

tests/test_diagrams.py checks every diagram's size, title and fonts; here the cells
and numbers of each diagram are read back (by their ``gid``) and compared with an
independent computation: the rule of each pattern written out, MoBA's and NSA's choice
of blocks computed by a loop.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from attention import use_course_style
from attention.course.diagrams import _draw, efficient


@pytest.fixture(autouse=True)
def style_and_close():
    use_course_style()
    yield
    plt.close("all")


def by_gid(fig, kind) -> dict[str, object]:
    return {a.get_gid(): a for a in fig.findobj(kind) if a.get_gid()}


def fills(fig, gid: str, n: int) -> list[tuple]:
    """The face colours of the cells ``gid[0,0] ... gid[0,n-1]`` of a one-row grid."""
    cells = by_gid(fig, Rectangle)
    return [tuple(cells[f"{gid}[0,{j}]"].get_facecolor()) for j in range(n)]


def rgba(colour) -> tuple:
    return tuple(to_rgba(colour))


# --------------------------------------------------------------------------- chapter 10


@pytest.mark.slow  # draws some 150 to 200 cells: make test, not make check
def test_two_orders_prints_the_multiply_adds_of_each_order():
    n, d, e = 4096, 64, 64
    fig = efficient.two_orders(n, d, e)
    texts = by_gid(fig, Text)
    counts = {}
    for order in ("(QKᵀ)V", "Q(KᵀV)"):
        number = texts[f"cost:{order}"].get_text().rsplit(": ", 1)[1]
        counts[order] = int(number.split()[0].replace(",", ""))
    assert counts["(QKᵀ)V"] == n * n * d + n * n * e  # QK^T, then (QK^T) V
    assert counts["Q(KᵀV)"] == d * n * e + n * d * e  # K^T V, then Q (K^T V)
    cells = by_gid(fig, Rectangle)

    def grid(prefix):  # (rows, cols) of the cells drawn for one matrix
        keys = [g[len(prefix) :] for g in cells if g.startswith(prefix + "[")]
        pairs = [tuple(int(x) for x in key.strip("[]").split(",")) for key in keys]
        return max(r for r, _ in pairs) + 1, max(c for _, c in pairs) + 1

    assert grid("(QKᵀ)V:QKᵀ:2") == (8, 8)  # n x n, drawn for n = 8
    assert grid("Q(KᵀV):KᵀV:2") == (2, 2)  # d x e, drawn for d = e = 2
    assert grid("Q(KᵀV):O:6") == grid("(QKᵀ)V:O:4") == (8, 2)


@pytest.mark.slow  # draws some 150 to 200 cells: make test, not make check
def test_chunkwise_form_colours_each_pair_by_the_part_that_computes_it():
    n, chunk = 12, 4
    fig = efficient.chunkwise_form(n, chunk)
    cells = by_gid(fig, Rectangle)
    colours = {
        "tile": rgba(_draw.tint(_draw.ROLE["weight"], 0.75)),
        "state": rgba(_draw.tint(_draw.ROLE["key"], 0.75)),
        "hidden": rgba(_draw.BLOCKED),
    }
    for i in range(n):
        for j in range(n):
            if j > i:
                part = "hidden"
            elif i // chunk == j // chunk:
                part = "tile"
            else:
                part = "state"
            shown = tuple(cells[f"pairs[{i},{j}]"].get_facecolor())
            assert shown == colours[part], (i, j, part)


# --------------------------------------------------------------------------- chapter 11


def grid_numbers(fig, gid: str, rows: int, cols: int) -> torch.Tensor:
    """The numbers printed in the cells ``gid[r,c]`` of a grid, as a tensor."""
    texts = by_gid(fig, Text)
    return torch.tensor(
        [
            [float(texts[f"{gid}[{r},{c}]"].get_text()) for c in range(cols)]
            for r in range(rows)
        ],
        dtype=torch.float64,
    )


def test_memory_write_read_sums_the_outer_products_and_reads_the_value_back():
    fig = efficient.memory_write_read(read=1)
    keys, values = efficient.memory_example()
    d, e = keys.shape[1], values.shape[1]
    total = torch.zeros(d, e, dtype=torch.float64)
    for j in range(len(keys)):  # the sum written out, one pair at a time
        outer = torch.tensor(
            [[float(keys[j, a] * values[j, b]) for b in range(e)] for a in range(d)],
            dtype=torch.float64,
        )
        assert torch.equal(grid_numbers(fig, f"write[{j}]", d, e), outer)
        total += outer
    assert torch.equal(grid_numbers(fig, "S", d, e), total)  # one decimal: exact here
    assert torch.equal(grid_numbers(fig, "read", 1, e)[0], values[1])
    dots = by_gid(fig, Text)["dots"].get_text()
    assert "0·v₁ + 1·v₂ + 0·v₃" in dots  # orthonormal keys: only k2 . q = 1


def test_chunkwise_delta_prints_the_corrections_of_the_recurrence():
    fig = efficient.chunkwise_delta()
    q, k, v, beta, c = efficient.chunk_example()
    d, e = k.shape[1], v.shape[1]
    # the recurrence, token by token: u_t = beta_t (v_t - S^T k_t), S += k_t u_t^T
    S = torch.zeros(d, e, dtype=torch.float64)
    corrections = []
    for t in range(2 * c):
        u = beta[t] * (v[t] - k[t] @ S)
        corrections.append(u)
        S = S + torch.outer(k[t], u)
    second = torch.stack(corrections[c:])  # the drawn chunk is the second one
    shown = grid_numbers(fig, "U", c, e)
    assert (shown - second).abs().max() <= 0.005 + 1e-12  # printed to 2 decimals
    texts = by_gid(fig, Text)
    K, b = k[c:], beta[c:]
    for r in range(c):
        for s in range(c):
            if s < r:  # strictly lower: A[r, s] = beta_r k_r . k_s
                expected = float(b[r] * (K[r] @ K[s]))
                assert texts[f"A[{r},{s}]"].get_text() == f"{expected:.2f}"
            else:
                assert f"A[{r},{s}]" not in texts
    pieces = efficient.chunk_pieces()
    identity = torch.eye(c, dtype=torch.float64)
    torch.testing.assert_close(
        (identity + pieces["A"]) @ pieces["U~"], b[:, None] * v[c:]
    )
    torch.testing.assert_close(pieces["S'"], S)  # the state after the chunk


# --------------------------------------------------------------------------- chapter 13


def test_keys_a_query_sees_draws_each_patterns_rule():
    fig = efficient.keys_a_query_sees()
    n, query = 20, 10
    off = query - torch.arange(n)  # query minus key
    window = off.abs() <= 2
    expected = {
        "window, w = 2": window,
        "causal window, w = 2": (off >= 0) & (off <= 2),
        "dilated, w = 2, r = 3": (off.abs() <= 6) & (off % 3 == 0),
        "window + global token 0": window | (torch.arange(n) == 0),
    }
    texts = by_gid(fig, Text)
    hidden = rgba(_draw.BLOCKED)
    for name, keep in expected.items():
        shown = [colour != hidden for colour in fills(fig, f"pattern:{name}", n)]
        assert shown == keep.tolist(), name
        assert texts[f"count:{name}"].get_text() == f"{int(keep.sum())} keys"
    big = fills(fig, "pattern:BigBird: + 2 random keys", n)
    assert big[0] == rgba(_draw.ROLE["query"])  # the global token
    assert all(big[j] == rgba(_draw.MAY_ATTEND) for j in range(8, 13))
    randoms = [j for j in range(n) if big[j] == rgba(_draw.ROLE["value"])]
    assert len(randoms) == 2 and all(not window[j] and j != 0 for j in randoms)
    assert sum(c != hidden for c in big) == 8
    assert texts["count:BigBird: + 2 random keys"].get_text() == "8 keys"


def test_block_selection_prints_the_mean_key_scores_and_keeps_the_best_block():
    fig = efficient.block_selection()
    q, k, t, block, top_k = efficient.block_example()
    assert top_k == 2  # one past block and the own block
    n = k.shape[0]
    own = t // block
    scores = []
    for c in range(own):  # a loop over the past blocks: their mean key
        mean = sum(k[c * block + j] for j in range(block)) / block
        scores.append(float(q[t] @ mean))
    texts = by_gid(fig, Text)
    for c, score in enumerate(scores):
        assert texts[f"score[{c}]"].get_text() == f"{score:.2f}"
    best = max(range(own), key=lambda c: scores[c])
    kept = [(j // block in (best, own)) and j <= t for j in range(n)]
    shown = [c == rgba(_draw.ROLE["key"]) for c in fills(fig, "chosen", n)]
    assert shown == kept


def test_nsa_branches_show_complete_blocks_the_selection_and_the_window():
    fig = efficient.nsa_branches()
    q, k, v, t, block, selected, window = efficient.nsa_example()
    n, d = k.shape[-2:]
    nb = n // block
    own = t // block
    cells = by_gid(fig, Rectangle)
    complete = [(c + 1) * block - 1 <= t for c in range(nb)]
    for c in range(nb):
        colour = tuple(cells[f"pooled[{c}]"].get_facecolor())
        assert (colour == rgba(_draw.ROLE["weight"])) == complete[c]
    # the ranking: softmax over the complete blocks' mean keys, scaled by 1/sqrt(d)
    scores = torch.tensor(
        [
            float(q[0, 0, t] @ k[0, 0, c * block : (c + 1) * block].mean(0))
            / math.sqrt(d)
            for c in range(nb)
            if complete[c]
        ]
    )
    forced = {0, own - 1, own}
    free = [c for c in range(len(scores)) if c not in forced]
    ranked = sorted(free, key=lambda c: -float(scores.softmax(0)[c]))
    kept = forced | set(ranked[: selected - len(forced)])
    expect = [(j // block in kept) and j <= t for j in range(n)]
    shown = [c == rgba(_draw.ROLE["key"]) for c in fills(fig, "selected", n)]
    assert shown == expect
    recent = [t - window < j <= t for j in range(n)]
    shown = [c == rgba(_draw.MAY_ATTEND) for c in fills(fig, "window", n)]
    assert shown == recent


# --------------------------------------------------------------------------- chapter 14


def test_online_tiles_print_the_running_max_and_sum_of_the_followed_query():
    fig = efficient.online_tiles()
    q, k, v, block, query = efficient.online_tiles_example()
    scores = [float(q[query] @ k[j]) / math.sqrt(q.shape[-1]) for j in range(len(k))]
    texts = by_gid(fig, Text)
    previous = None
    for t in range(len(k) // block):
        seen = scores[: (t + 1) * block]
        m = max(seen)
        total = sum(math.exp(s - m) for s in seen)
        assert texts[f"state[{t}]"].get_text() == f"m = {m:.2f}\nℓ = {total:.2f}"
        if previous is not None:
            assert texts[f"rescale[{t}]"].get_text() == f"×{math.exp(previous - m):.2f}"
        previous = m
    # the example shows both: a maximum that grows (a factor below 1), and one that
    # stays
    factors = [texts[f"rescale[{t}]"].get_text() for t in range(1, len(k) // block)]
    assert "×1.00" in factors and any(f != "×1.00" for f in factors)
    # the followed query's block is the highlighted row
    cells = by_gid(fig, Rectangle)
    last = query // block
    row = {tuple(cells[f"tile[{last},{c}]"].get_facecolor()) for c in range(4)}
    other = {tuple(cells[f"tile[0,{c}]"].get_facecolor()) for c in range(4)}
    assert len(row) == 1 and row != other


# --------------------------------------------------------------------------- chapter 15


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_steps_show_the_blocks_held_and_the_causal_work(layout):
    fig = efficient.ring_steps()
    p = 4
    chunks = (
        (lambda r: [r]) if layout == "contiguous" else (lambda r: [r, 2 * p - 1 - r])
    )
    area = 1.0 if layout == "contiguous" else 0.25
    texts = by_gid(fig, Text)
    for t in range(p):
        for r in range(p):
            held = chunks((r - t) % p)  # the ring moves keys one rank per step
            assert texts[f"held:{layout}[{t},{r}]"].get_text() == ",".join(
                map(str, held)
            )
    for r in range(p):
        # every (query chunk, key chunk) pair of the rank: a key chunk before the
        # query chunk is a full block, the same chunk half of one, a later one nothing
        work = sum(
            area * (1.0 if b < a else 0.5 if b == a else 0.0)
            for a in chunks(r)
            for s in range(p)
            for b in chunks(s)
        )
        assert texts[f"total:{layout}[{r}]"].get_text() == f"{work:g}"


def test_ring_work_is_balanced_only_by_the_zigzag_layout():
    contiguous = [sum(col) for col in zip(*efficient.ring_work(4, "contiguous"))]
    zigzag = [sum(col) for col in zip(*efficient.ring_work(4, "zigzag"))]
    assert contiguous == [0.5, 1.5, 2.5, 3.5] and zigzag == [2.0] * 4


# --------------------------------------------------------------------------- chapter 16


def test_program_grid_shows_the_grid_and_the_causal_tiles_of_one_program():
    fig = efficient.program_grid()
    i, block, heads = 64, 16, 3
    cells = by_gid(fig, Rectangle)
    n_m = -(-i // block)
    assert {g for g in cells if g.startswith("program[")} == {
        f"program[{m},{z}]" for m in range(n_m) for z in range(heads)
    }
    kinds_of_fill = {
        rgba(efficient._TILE_FILLS[kind]): kind for kind in efficient._TILE_FILLS
    }
    for m in range(n_m):
        for n in range(n_m):
            # causal, one block size: the key blocks before the program's are whole,
            # its own (the diagonal) is masked, the later ones hold only future keys
            expected = 1 if n < m else 2 if n == m else 0
            fill = tuple(cells[f"tile[{m},{n}]"].get_facecolor())
            assert kinds_of_fill[fill] == expected, (m, n)
    texts = by_gid(fig, Text)
    assert [texts[f"visit[{n}]"].get_text() for n in range(3)] == ["1", "2", "3"]
    assert "visit[3]" not in texts


# --------------------------------------------------------------------------- chapter 12


def test_gated_delta_update_prints_decay_correction_and_write_of_a_loop():
    fig = efficient.gated_delta_update()
    state, key, value, beta, alpha = efficient.gated_delta_example()
    d, e = state.shape
    # the step written out entry by entry: decay, read, correct, write
    decayed = [[alpha * float(state[i, j]) for j in range(e)] for i in range(d)]
    read = [sum(key[i] * decayed[i][j] for i in range(d)) for j in range(e)]
    corrected = [
        [decayed[i][j] - beta * float(key[i]) * float(read[j]) for j in range(e)]
        for i in range(d)
    ]
    after = [
        [corrected[i][j] + beta * float(key[i]) * float(value[j]) for j in range(e)]
        for i in range(d)
    ]
    texts = by_gid(fig, Text)

    def shown(gid, r, c):
        return texts[f"{gid}[{r},{c}]"].get_text()

    for name, grid in (
        ("decayed", decayed),
        ("corrected", corrected),
        ("after", after),
    ):
        for i in range(d):
            for j in range(e):
                want = f"{grid[i][j]:.2f}".replace("-0.00", "0.00")
                assert shown(name, i, j) == want, (name, i, j)
    for j in range(e):
        assert shown("read", 0, j) == f"{float(read[j]):.2f}"
        assert shown("value", 0, j) == f"{float(value[j]):.2f}"
    # the last state is the package's, within float64 rounding of the loop
    stages = efficient.gated_delta_stages()
    torch.testing.assert_close(
        stages["after"], torch.tensor(after, dtype=torch.float64), rtol=0, atol=1e-12
    )


def test_channel_decay_shows_powers_of_each_channels_gate():
    fig = efficient.channel_decay()
    scalar, per_channel = efficient.channel_decay_example()
    steps, d = scalar.shape
    texts = by_gid(fig, Text)
    for gid, log_decay in (("scalar", scalar), ("channel", per_channel)):
        for i in range(d):
            rate = math.exp(float(log_decay[0, i]))
            for t in range(steps):
                want = f"{rate ** (t + 1):.1f}"
                assert texts[f"{gid}[{i},{t}]"].get_text() == want, (gid, i, t)
    # one gate per step: every channel alike; one per channel: two speeds
    kept = efficient.kept_per_channel(per_channel)
    assert kept[:3, -1].min() > 0.8 > 0.01 > kept[3:, -1].max()
    alike = efficient.kept_per_channel(scalar)
    assert torch.equal(alike, alike[:1].expand_as(alike))


def test_qwen3_next_layer_prints_the_layers_sizes_at_qwen3_next_scale():
    fig = efficient.qwen3_next_layer()
    texts = by_gid(fig, Text)
    hidden, h, d, h_v, e = 2048, 16, 128, 32, 128  # Qwen3-Next-80B-A3B
    assert texts["size:w_query.weight"].get_text() == f"W_Q: {hidden} → {h * d}"
    assert texts["size:conv.weight"].get_text() == f"{2 * h * d + h_v * e} channels"
    assert texts["size:log_decay_rate"].get_text() == f"{h_v} value heads"
    assert texts["size:w_out.weight"].get_text() == f"W_O: {h_v * e} → {hidden}"
