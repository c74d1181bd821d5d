"""Diagrams of the Efficient-attention part (chapters 10-16), one section per chapter.

Each function returns a matplotlib Figure drawn with :mod:`._draw`; a chapter shows it
in a cell tagged ``diagram`` and ``remove-input``. Every mask, selection and number a
diagram shows is computed by the package on a tiny seeded example (the pattern builders
of :mod:`attention.efficient.patterns`, :func:`~attention.moba_attention`,
:func:`~attention.native_sparse_attention`), so the picture cannot drift from the
mechanism it shows; each such cell or text carries a ``gid`` naming what it shows
(``pattern:window[j]``, ``score[c]`` ...) for the tests.

Shape legend: ``n`` positions, ``t`` the query followed, ``B`` a block size, ``w`` a
window. Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from matplotlib.patches import Rectangle

from ...efficient.learned_sparse import moba_attention, native_sparse_attention
from ...efficient.patterns import (
    bigbird_mask,
    dilated_mask,
    global_tokens_mask,
    sliding_window_mask,
)
from . import _draw as draw

__all__ = ["keys_a_query_sees", "block_selection", "nsa_branches"]

# --------------------------------------------------------------------------- chapter 13

#: Colours of the parts of a pattern: window keys, global keys, random keys, a chosen
#: block; hidden keys are ``draw.BLOCKED``.
_WINDOW, _GLOBAL, _RANDOM = draw.MAY_ATTEND, draw.ROLE["query"], draw.ROLE["value"]
_CHOSEN = draw.ROLE["key"]


def pattern_rows(n: int = 20, query: int = 10) -> dict[str, torch.Tensor]:
    """The rows drawn by :func:`keys_a_query_sees`: ``{name: (n,) long}``, 0 for a
    hidden key, 1 a window (or dilated) key, 2 a global key, 3 a random key.

    Computed from the package's masks: ``sliding_window_mask``, ``dilated_mask``,
    ``global_tokens_mask`` and ``bigbird_mask`` (seed 0), row ``query``.
    """
    w = 2
    window = sliding_window_mask(n, w)[query]
    causal = sliding_window_mask(n, w, is_causal=True)[query]
    dilated = dilated_mask(n, w, 3)[query]
    glob = global_tokens_mask(n, w, [0])[query]
    big = bigbird_mask(n, w, 1, 2, seed=0)[query]
    is_global = torch.arange(n) == 0
    rows = {
        f"window, w = {w}": window.long(),
        f"causal window, w = {w}": causal.long(),
        f"dilated, w = {w}, r = 3": dilated.long(),
        "window + global token 0": glob.long() + (glob & is_global).long(),
    }
    bb = big.long()
    bb[is_global & big] = 2
    bb[big & ~window & ~is_global] = 3
    rows["BigBird: + 2 random keys"] = bb
    return rows


def keys_a_query_sees():
    """The keys one query sees under five fixed patterns, one strip of keys each.

    Query 10 of 20 positions; dark cells are keys in its window (or its dilated
    window), blue a global token, green BigBird's random keys, light the keys it never
    sees. The count of seen keys is written after each strip (``count:<name>``).

    Returns:
        The Figure.
    """
    n, query = 20, 10
    rows = pattern_rows(n, query)
    fig, ax = draw.canvas(7.2, 3.5, "The keys one query sees under fixed patterns")
    cell, left = 0.22, 2.1
    colours = {0: draw.BLOCKED, 1: _WINDOW, 2: _GLOBAL, 3: _RANDOM}
    top = 2.72
    for r, (name, row) in enumerate(rows.items()):
        y = top - 0.4 * r
        bounds = draw.matrix(
            ax,
            (left + n * cell / 2, y),
            1,
            n,
            cell=cell,
            fills=[[colours[int(v)] for v in row]],
            colour=draw.INK,
            gid=f"pattern:{name}",
        )
        draw.label(ax, (bounds.left - 0.12, y), name, size=draw.SMALL, ha="right")
        count = draw.label(
            ax,
            (bounds.right + 0.1, y),
            f"{int((row > 0).sum())} keys",
            size=draw.SMALL,
            ha="left",
        )
        count.set_gid(f"count:{name}")
        if r == 0:
            for j in (0, 5, 10, 15, 19):
                draw.label(
                    ax,
                    (bounds.left + (j + 0.5) * cell, bounds.top + 0.08),
                    str(j),
                    size=draw.SMALL,
                    colour=draw.MUTED,
                    va="bottom",
                )
    x = left + (query + 0.5) * cell
    bottom = top - 0.4 * (len(rows) - 1) - cell / 2
    draw.arrow(ax, (x, bottom - 0.32), (x, bottom - 0.02), colour=draw.INK)
    draw.label(
        ax,
        (x, bottom - 0.36),
        f"the query ({query})",
        size=draw.SMALL,
        va="top",
    )
    draw.legend(
        ax,
        (0.3, 0.62),
        [(_WINDOW, "window keys"), (_GLOBAL, "global token")],
    )
    draw.legend(
        ax,
        (5.55, 0.62),
        [(_RANDOM, "random keys"), (draw.BLOCKED, "never seen")],
    )
    return fig


def block_example():
    """The tiny seeded example of :func:`block_selection`: ``(q, k, t, B, top_k)``,
    one query row ``q`` ``(n, d)`` is the query followed, ``t`` its position."""
    n, d, block, top_k, t = 16, 4, 4, 2, 13
    g = torch.Generator().manual_seed(4)
    q = torch.randn(n, d, generator=g, dtype=torch.float64)
    k = torch.randn(n, d, generator=g, dtype=torch.float64)
    return q, k, t, block, top_k


def block_selection():
    """MoBA's gate: a query scores each past block by its mean key and keeps the best.

    16 keys in 4 blocks of 4; query 13 sits in block 3. The mean of each block's keys is
    its summary; the query's dot product with the summaries of the past blocks is
    printed (``score[c]``) and the best ``top_k - 1 = 1`` is kept, with the query's own
    block, which is kept whatever its score (its mean holds future keys). The choice
    drawn is :func:`~attention.moba_attention`'s (``chosen[j]`` on the key strip).

    Returns:
        The Figure.
    """
    q, k, t, block, top_k = block_example()
    n = k.shape[0]
    nb = n // block
    means = k.view(nb, block, -1).mean(dim=1)  # (nb, d)
    scores = means @ q[t]  # (nb,)
    _, blocks = moba_attention(
        q[None, None],
        k[None, None],
        k[None, None],
        block_size=block,
        top_k=top_k,
        return_block_indices=True,
    )
    kept = {int(c) for c in blocks[0, 0, t] if c >= 0}
    own = t // block

    fig, ax = draw.canvas(7.2, 3.55, "Choosing blocks by their mean key (MoBA)")
    cell, left = 0.3, 1.3
    y_keys, y_means, y_kept = 2.55, 1.55, 0.62
    # the keys, in blocks
    fills = [[draw.tint(draw.ROLE["key"]) for _ in range(n)]]
    keys = draw.matrix(
        ax, (left + n * cell / 2, y_keys), 1, n, cell=cell, fills=fills, gid="keys"
    )
    draw.label(ax, (keys.left - 0.12, y_keys), "keys", ha="right")
    for c in range(nb):
        x0 = keys.left + c * block * cell
        draw.bracket(
            ax,
            (x0 + 0.03, keys.top + 0.05),
            (x0 + block * cell - 0.03, keys.top + 0.05),
            f"block {c}",
            side="above",
        )
    query = draw.Bounds(keys.left + t * cell, keys.bottom, cell, cell)
    draw.outline(ax, query, colour=draw.ROLE["query"])
    draw.label(
        ax,
        (query.centre[0], query.bottom - 0.08),
        f"query {t}",
        size=draw.SMALL,
        colour=draw.ROLE["query"],
        va="top",
    )
    # the mean keys and the scores
    for c in range(nb):
        centre = (keys.left + (c + 0.5) * block * cell, y_means)
        fill = draw.tint(draw.ROLE["key"], 0.5 if c != own else 0.15)
        mean = draw.matrix(
            ax, centre, 1, 1, cell=0.42, fills=[[fill]], gid=f"mean[{c}]"
        )
        draw.label(ax, mean.centre, f"$\\bar k_{c}$", size=12)
        draw.arrow(
            ax,
            (centre[0], keys.bottom - 0.2),
            (centre[0], mean.top),
            colour=draw.MUTED,
        )
        if c in kept:
            draw.outline(ax, mean, colour=_CHOSEN)
        if c < own:
            text = draw.label(
                ax,
                (mean.right + 0.1, y_means),
                f"{float(scores[c]):.2f}",
                ha="left",
                fontweight="bold" if c in kept else "normal",
            )
            text.set_gid(f"score[{c}]")
        else:
            draw.label(
                ax,
                (mean.right + 0.08, y_means),
                "own block:\nalways kept",
                size=draw.SMALL,
                ha="left",
                colour=draw.MUTED,
            )
    draw.label(ax, (keys.left - 0.12, y_means), "mean key\nand score", ha="right")
    # the keys the query attends to
    chosen = [
        _CHOSEN if (j // block in kept and j <= t) else draw.BLOCKED for j in range(n)
    ]
    strip = draw.matrix(
        ax,
        (left + n * cell / 2, y_kept),
        1,
        n,
        cell=cell,
        fills=[chosen],
        colour=draw.INK,
        gid="chosen",
    )
    draw.label(ax, (strip.left - 0.12, y_kept), "attended", ha="right")
    draw.label(
        ax,
        (strip.centre[0], strip.bottom - 0.08),
        f"top_k = {top_k}: the best past block and the own block "
        f"(causal inside it: keys up to {t})",
        size=draw.SMALL,
        colour=draw.MUTED,
        va="top",
    )
    return fig


def nsa_example():
    """The tiny seeded example of :func:`nsa_branches`: ``(q, k, v, t, B, s, w)``."""
    n, d, block, selected, window, t = 24, 4, 4, 4, 4, 21
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 1, n, d, generator=g, dtype=torch.float64) for _ in "qkv")
    return q, k, v, t, block, selected, window


def nsa_branches():
    """NSA's three branches for one query, and the gate that mixes them.

    24 keys in blocks of 4; query 21. The compressed branch attends to the mean-pooled
    blocks that are complete (``pooled[c]``); the selected branch to the keys of the
    blocks :func:`~attention.native_sparse_attention` keeps (``selected[j]``: the first,
    the previous and the own block always, and the best-ranked other one); the window
    branch to the last ``w`` keys (``window[j]``). Their outputs are summed with gates.

    Returns:
        The Figure.
    """
    q, k, v, t, block, selected, window = nsa_example()
    n = k.shape[-2]
    nb = n // block
    _, blocks = native_sparse_attention(
        q,
        k,
        v,
        block_size=block,
        num_selected_blocks=selected,
        window_size=window,
        return_block_indices=True,
    )
    kept = {int(c) for c in blocks[0, 0, t] if c >= 0}
    complete = [(c + 1) * block - 1 <= t for c in range(nb)]

    fig, ax = draw.canvas(7.2, 3.5, "Native sparse attention: three branches, one gate")
    cell, left = 0.14, 1.5
    rows = (2.6, 1.7, 0.8)
    names = ("compressed", "selected", "window")
    notes = (
        "mean of each complete block",
        f"{selected} blocks: first, previous, own + best",
        f"the last {window} keys",
    )
    future = draw.tint(draw.GRID, 0.15)  # keys after the query: never seen

    def key_fill(j, on, colour):
        if j > t:
            return future
        return colour if on else draw.BLOCKED

    strips = []
    # compressed: one cell per block, as wide as the block's keys
    width = n * cell
    y = rows[0] - cell / 2
    for c in range(nb):
        colour = draw.ROLE["weight"] if complete[c] else draw.BLOCKED
        patch = Rectangle(
            (left + c * block * cell, y),
            block * cell,
            cell,
            facecolor=colour,
            edgecolor=draw.GRID,
            lw=0.6,
        )
        patch.set_gid(f"pooled[{c}]")
        ax.add_patch(patch)
    ax.add_patch(
        Rectangle((left, y), width, cell, fill=False, edgecolor=draw.INK, lw=1.6)
    )
    strips.append(draw.Bounds(left, y, width, cell))
    chosen = [key_fill(j, j // block in kept, _CHOSEN) for j in range(n)]
    recent = [key_fill(j, t - window < j <= t, _WINDOW) for j in range(n)]
    for y, fills, gid in ((rows[1], chosen, "selected"), (rows[2], recent, "window")):
        strips.append(
            draw.matrix(
                ax,
                (left + width / 2, y),
                1,
                n,
                cell=cell,
                fills=[fills],
                colour=draw.INK,
                gid=gid,
            )
        )
    for strip, name, note in zip(strips, names, notes):
        draw.label(ax, (strip.left - 0.12, strip.centre[1]), name, ha="right")
        draw.label(
            ax,
            (strip.left, strip.bottom - 0.06),
            note,
            size=draw.SMALL,
            colour=draw.MUTED,
            ha="left",
            va="top",
        )
        if strip is not strips[0]:
            draw.outline(
                ax,
                draw.Bounds(left + t * cell, strip.bottom, cell, cell),
                colour=draw.ROLE["query"],
                pad=0.03,
            )
    draw.label(
        ax,
        (left + (t + 0.5) * cell, strips[0].top + 0.1),
        f"query {t}",
        size=draw.SMALL,
        colour=draw.ROLE["query"],
        va="bottom",
    )
    # the gate: one weight per branch, then the sum
    gates = []
    for strip, symbol in zip(strips, ("cmp", "slc", "swa")):
        gate = draw.box(
            ax,
            (strip.right + 0.72, strip.centre[1]),
            f"$o^{{{symbol}}}_t \\times g^{{{symbol}}}_t$",
            width=1.1,
            height=0.5,
            size=12,
        )
        draw.arrow(ax, strip.east, gate.west)
        gates.append(gate)
    total = draw.box(ax, (6.78, rows[1]), "$o_t$", width=0.55, height=0.5, size=12)
    draw.label(ax, (total.centre[0], total.top + 0.08), "sum", va="bottom")
    for gate in gates:
        draw.arrow(ax, gate.east, total.west)
    draw.label(
        ax,
        (left, 0.3),
        f"light: not attended;  palest: after the query (keys {t + 1} to {n - 1})",
        size=draw.SMALL,
        colour=draw.MUTED,
        ha="left",
    )
    return fig
