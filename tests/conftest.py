"""Shared test settings for a 2-core CI machine: hypothesis profiles, one thread, the
longest test files first, the garbage collector kept off the imported modules, and a
check that a test which imports transformers or fla is marked slow."""

import gc
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "course",
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run and machine
    suppress_health_check=[HealthCheck.too_slow],
)
# make check, the quick loop, draws fewer examples; make test and CI draw all 60
settings.register_profile(
    "check", parent=settings.get_profile("course"), max_examples=20
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "course"))
torch.set_num_threads(1)
# The Triton kernels (attention.efficient.triton_flash, an optional extra) run on a CPU
# only under Triton's interpreter, which must be chosen before anything imports triton:
# some tests import it indirectly (through torch) before tests/test_triton_flash.py
# runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The objects made so far (torch's and hypothesis's modules, hundreds of thousands) live
# until the process ends: move them out of the garbage collector's reach, so each full
# collection does not walk them again (about a fifth of the unit tests' time).
gc.freeze()


def qkv(
    i,
    j=None,
    *,
    d=8,
    e=5,
    batch=(2, 3),
    h=None,
    h_kv=None,
    seed=0,
    grad=False,
    dtype=torch.float64,
    size=1.0,
):
    """Random query ``(*batch, [h,] i, d)``, key ``(*batch, [h_kv,] j, d)`` and value
    ``(*batch, [h_kv,] j, e)``, drawn in that order from one seeded generator (float64).

    The one test helper for attention inputs (``from conftest import qkv``). ``h`` and
    ``h_kv`` add a heads axis (``h_kv`` defaults to ``h``); ``size`` multiplies the
    queries and keys (large logits); ``grad`` makes all three leaves that require grad.
    """
    j = i if j is None else j
    heads_q = () if h is None else (h,)
    heads_kv = heads_q if h_kv is None else (h_kv,)
    g = torch.Generator().manual_seed(seed)
    q = size * torch.randn(*batch, *heads_q, i, d, generator=g, dtype=dtype)
    k = size * torch.randn(*batch, *heads_kv, j, d, generator=g, dtype=dtype)
    v = torch.randn(*batch, *heads_kv, j, e, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


#: Test files that take longest (process launches and installs, benchmark scripts,
#: Chromium), handed out first under `pytest -n 2 --dist loadfile` so that they overlap
#: with the rest instead of leaving one worker idle at the end. Only the order changes.
LONGEST_FIRST = ("test_reader_launch.py", "test_benchmarks.py", "test_distributed.py")


def pytest_collection_modifyitems(items):
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


def pytest_collection_finish(session):
    """Freeze what collection made (test modules, parameters) as the imports above."""
    gc.collect()
    gc.freeze()


#: Libraries whose first use in a test process costs a second or two of imports: a test
#: that uses them is slow (CONTRIBUTING.md, "Tests"), or `make check` pays for them.
HEAVY_IMPORTS = ("transformers", "fla")
_loaded_before = pytest.StashKey[frozenset]()


def _heavy_loaded():
    # a test may stand None in for a module to mimic its absence
    return frozenset(
        name for name in HEAVY_IMPORTS if sys.modules.get(name) is not None
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_loaded_before] = _heavy_loaded()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Fail a test not marked slow that is the first in its process to import one of
    HEAVY_IMPORTS (in its fixtures or its body). `make check`, which leaves the slow
    tests out, finds every such test; where slow tests run too, one of them may import
    the library first."""
    result = yield
    new = _heavy_loaded() - item.stash.get(_loaded_before, frozenset())
    if new and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} imports {', '.join(sorted(new))}, a second or two of CPU "
            "in each test process: mark it @pytest.mark.slow (CONTRIBUTING.md, Tests)",
            pytrace=False,
        )
    return result
