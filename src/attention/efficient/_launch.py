"""Run a function on P local processes joined in a gloo process group (chapter 15).

Kept apart from ``distributed.py``: this is plumbing (process start-up, a rendezvous
store, time limits, clean-up), not attention. Every process is started with
``torch.multiprocessing``'s ``spawn`` method, so it imports the function afresh: the
function must live in an importable module, not in a notebook cell.
"""

from __future__ import annotations

import datetime
import numbers
import os
import pickle
import queue
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._checks import check_int

__all__ = ["run_distributed"]


def _worker(
    rank: int, world_size: int, port: int, payload: bytes, results, timeout: float
) -> None:
    """Entry point of one process: join the group, run the function, report back."""
    try:
        torch.set_num_threads(1)  # P processes share the machine's cores
        # All ranks live on this machine: let gloo talk over the loopback interface.
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        limit = datetime.timedelta(seconds=timeout)
        # TCPStore is public (documented) though torch.distributed's __all__ omits it
        store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
            "127.0.0.1", port, world_size, False, timeout=limit
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=limit
        )
        fn, args = pickle.loads(payload)
        value = fn(rank, world_size, *args)
        report = ("ok", rank, pickle.dumps(value if rank == 0 else None))
    except BaseException as err:  # reported to the parent, which raises it there
        try:
            exc = pickle.dumps(err)
        except Exception:
            exc = None
        report = (
            "error",
            rank,
            (exc, type(err).__name__, str(err), traceback.format_exc()),
        )
    # Report before leaving the group: leaving closes the connections, and the other
    # ranks' "connection closed" errors must not arrive before the cause.
    results.put(report)
    if dist.is_initialized():
        dist.destroy_process_group()


def _stop(processes) -> None:
    """Terminate, then kill, every process still alive, and reap them all."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes and return
    rank 0's result.

    Each process is spawned fresh (``torch.multiprocessing``, start method ``spawn``),
    uses one CPU thread, and joins a gloo process group over localhost (a rendezvous
    store on a free port held by this process), so ``fn`` can call ``torch.distributed``
    collectives and :func:`~attention.efficient.distributed.ring_attention`. Usable from
    a notebook cell: nothing is left running when it returns or raises.

    Never hangs: the whole run (start-up included: each process imports torch, seconds
    on a loaded machine) must finish within ``timeout`` seconds, the group's own
    operations time out after ``timeout`` too, and when any rank fails the others are
    stopped at once.

    Args:
        fn: a module-level function (spawned processes import it by name; a lambda or a
            function defined in a notebook cell cannot be sent).
        world_size: the number of processes ``P`` (``>= 1``).
        *args: arguments after ``rank, world_size``; tensors are copied to every
            process.
        timeout: seconds allowed for the whole run.

    Returns:
        What ``fn`` returned on rank 0.

    Raises:
        TimeoutError: when the run did not finish in time (every process is killed).
        Exception: the exception a rank raised (the first to report), with the remote
            traceback in its notes; a ``RuntimeError`` when a process died without one.

    Example:
        >>> from attention.efficient.distributed import run_distributed
        >>> from attention.efficient._launch import _rank_and_size
        >>> run_distributed(_rank_and_size, 2)  # doctest: +SKIP
        [(0, 2), (1, 2)]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    world_size = check_int("world_size", world_size, minimum=1)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, numbers.Real)
        or not timeout > 0
    ):
        raise ValueError(
            f"timeout must be a positive number of seconds, got {timeout!r}"
        )
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(
        main, "__file__", None
    ):
        raise TypeError(
            "fn must be importable by the spawned processes, "
            f"but {fn.__qualname__!r} was defined interactively "
            "(a notebook cell or the REPL): define it in a module"
        )
    try:
        payload = pickle.dumps((fn, args))
        pickle.loads(
            payload
        )  # what the processes will do: fails for a function not importable
    except Exception as err:
        raise TypeError(
            "fn and args must be picklable and fn importable by name "
            f"(a module-level function), got {getattr(fn, '__qualname__', fn)!r}: {err}"
        ) from None
    timeout = float(timeout)
    limit = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
        "127.0.0.1", 0, None, True, timeout=limit, wait_for_workers=False
    )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, store.port, payload, results, timeout),
            daemon=True,
        )
        for r in range(world_size)
    ]
    deadline = time.monotonic() + timeout
    try:
        for p in processes:
            p.start()
        value, pending = None, set(range(world_size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"run_distributed: {len(pending)} of {world_size} "
                    f"processes (ranks {sorted(pending)}) had not "
                    f"finished after {timeout:g} s; all were stopped"
                )
            try:
                status, rank, data = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                dead = [r for r in pending if processes[r].exitcode is not None]
                if dead:  # gone without a report (killed, or crashed in C++)
                    time.sleep(0.5)  # a report may still be in the pipe
                    if results.empty():
                        raise RuntimeError(
                            f"run_distributed: rank {dead[0]} exited with code "
                            f"{processes[dead[0]].exitcode} without reporting"
                        ) from None
                continue
            pending.discard(rank)
            if status == "ok":
                if rank == 0:
                    value = pickle.loads(data)
                continue
            exc, name, message, remote = data
            err = None
            if exc is not None:
                try:
                    err = pickle.loads(exc)
                except Exception:
                    err = None
            if not isinstance(err, BaseException):
                err = RuntimeError(f"rank {rank} raised {name}: {message}")
            if hasattr(err, "add_note"):  # Python >= 3.11
                err.add_note(
                    f"raised on rank {rank} of {world_size}; its traceback:\n{remote}"
                )
            raise err
        return value
    finally:
        _stop(processes)
        results.close()
        results.join_thread()
        del store


def _rank_and_size(rank: int, world_size: int) -> list:
    """A tiny worker: every rank's ``(rank, world_size)``, gathered (for tests and
    examples)."""
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (rank, world_size))
    return everyone


def sleeping_worker(rank: int, world_size: int, seconds: float) -> None:
    """A worker that stalls (for the test that a stuck run is stopped)."""
    time.sleep(seconds)


def failing_worker(rank: int, world_size: int, rank_that_fails: int) -> None:
    """A worker that raises on one rank while the others wait for it in a collective."""
    if rank == rank_that_fails:
        raise ValueError(f"rank {rank} refuses")
    dist.barrier()
