"""pytest's hook for the chapters: the chapters that train run first.

Under ``pytest -n 2 --dist loadfile`` each chapter runs whole on one worker, handed out
in collection order. A chapter that trains for a minute or two and is handed out last
leaves the other worker idle meanwhile; handed out first, it overlaps with the rest.
Only the order changes: every cell of every chapter still runs, in its own order.
"""

from __future__ import annotations

#: The chapters that take longest, longest first (measured under nbval on two cores).
LONGEST_FIRST = (
    "12_gated_memory.ipynb",
    "19_reading_attention.ipynb",
    "07_position.ipynb",
    "08_cross_attention.ipynb",
)


def pytest_collection_modifyitems(items):
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}

    def key(item):
        return rank.get(item.path.name, len(rank))

    items.sort(key=key)  # stable: the cells of a chapter keep their order
