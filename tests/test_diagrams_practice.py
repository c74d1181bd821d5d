"""The In-practice part's diagrams show what the package computes.

tests/test_diagrams.py checks every diagram's size, title and fonts; here the shapes,
bytes and block tables each diagram prints are read back (by their ``gid``) and
compared with an independent computation: a BERT layer's shapes written out from its
sizes, the bytes per token from their formula, the block tables from the pool itself.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from attention import PagedKVCache, use_course_style
from attention.course.diagrams import practice


@pytest.fixture(autouse=True)
def style_and_close():
    use_course_style()
    yield
    plt.close("all")


def printed(fig, gid: str) -> str:
    found = [a.get_text() for a in fig.findobj(Text) if a.get_gid() == gid]
    assert len(found) == 1, f"{gid}: {found}"
    return found[0]


# --------------------------------------------------------------------------- chapter 17


@pytest.mark.slow  # loads a model: make test, not make check
@pytest.mark.parametrize("n, d_model, h", [(15, 384, 12), (7, 64, 4)])
def test_attention_layer_maps_prints_the_shapes_of_a_bert_layer(n, d_model, h):
    fig = practice.attention_layer_maps(n, d_model, h)
    d = d_model // h
    assert printed(fig, "shape:X") == f"({n}, {d_model})"
    assert printed(fig, "shape:Q") == f"({n}, {d_model}) each"
    assert printed(fig, "shape:Q_h") == f"({h}, {n}, {d}) each"
    assert printed(fig, "shape:A") == f"({h}, {n}, {n})"
    assert printed(fig, "shape:O_h") == f"({h}, {n}, {d})"
    assert printed(fig, "shape:O") == f"({n}, {d_model})"


def test_the_default_layer_is_minilms():
    assert practice.layer_shapes()["A"] == torch.Size([12, 15, 15])


# --------------------------------------------------------------------------- chapter 18


def test_cache_per_token_prints_the_bytes_of_each_kind():
    fig = practice.cache_per_token()
    c = practice.CACHE_EXAMPLE
    bf16 = 2
    expected = {
        "MHA": 2 * c["heads"] * c["head_dim"] * bf16,
        "GQA": 2 * c["gqa_kv_heads"] * c["head_dim"] * bf16,
        "MQA": 2 * 1 * c["head_dim"] * bf16,
        "MLA": (c["kv_lora_rank"] + c["rope_dim"]) * bf16,
    }
    for kind, nbytes in expected.items():
        assert printed(fig, f"bytes:{kind}") == f"{nbytes:,} B"


def test_cache_per_token_draws_one_cell_per_32_numbers():
    fig = practice.cache_per_token()
    cells = [
        r.get_gid()
        for r in fig.findobj(Rectangle)
        if (r.get_gid() or "")[:6] == "cells:"
    ]
    c = practice.CACHE_EXAMPLE
    count = {
        kind: sum(g.startswith(f"cells:{kind}[") for g in cells)
        for kind in "MHA GQA MQA MLA".split()
    }
    assert count == {
        "MHA": 2 * c["heads"] * c["head_dim"] // 32,
        "GQA": 2 * c["gqa_kv_heads"] * c["head_dim"] // 32,
        "MQA": 2 * c["head_dim"] // 32,
        "MLA": (c["kv_lora_rank"] + c["rope_dim"]) // 32,
    }


def test_paged_block_table_prints_each_table_and_each_blocks_owner():
    pool, ids = practice.paged_example()
    fig = practice.paged_block_table(pool, ids)
    s = pool.block_size
    held = {}
    for name, seq in ids.items():
        for n, physical in enumerate(pool.block_tables[seq]):
            assert printed(fig, f"table:{name}[{n}]") == str(physical)
            held[physical] = f"{name} {min(s, pool.lengths[seq] - n * s)}/{s}"
    for b in range(pool.num_blocks):
        assert printed(fig, f"fill:{b}") == held.get(b, "free")
    # the traced position's slot, from the rule written out
    first = next(iter(ids))
    p = pool.lengths[ids[first]] - 1
    table = pool.block_tables[ids[first]]
    assert printed(fig, "slot").endswith(f"= {table[p // s] * s + p % s}")


def test_paged_example_is_the_chapters_pool():
    pool, ids = practice.paged_example()
    assert {n: pool.lengths[s] for n, s in ids.items()} == {"A": 11, "B": 3, "C": 7}
    assert pool.blocks_in_use == 3 + 1 + 2
    # the blocks were handed out in a shuffled order, so the tables are not 0, 1, 2 ...
    assert pool.block_tables[ids["A"]] != [0, 1, 2]


def test_paged_block_table_draws_any_pool():
    pool = PagedKVCache(num_blocks=5, block_size=2, num_kv_heads=1, head_dim=1)
    seq = pool.add_sequence()
    pool.append(seq, torch.zeros(1, 3, 1), torch.zeros(1, 3, 1))
    fig = practice.paged_block_table(pool)
    assert printed(fig, "table:A[1]") == "1"
    assert printed(fig, "fill:1") == "A 1/2"
    assert printed(fig, "fill:4") == "free"
