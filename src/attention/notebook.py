"""Set-up shared by every chapter notebook: seeds, print options, threads, figure style."""

from __future__ import annotations

import random

import numpy as np
import torch

from .plotting import use_course_style

__all__ = ["setup_notebook"]


def setup_notebook(seed: int = 0, *, precision: int = 4, threads: int = 1) -> None:
    """Make a notebook's printed numbers reproducible across runs and machines.

    Seeds Python, NumPy and PyTorch; prints tensors and arrays with ``precision``
    decimals and no scientific notation; fixes the number of CPU threads (a different
    thread count can change the order of floating-point sums and so the last digits);
    applies the course's figure style.

    Args:
        seed: seed for every random generator.
        precision: decimals shown when printing tensors and arrays.
        threads: CPU threads PyTorch may use.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)
    use_course_style()
