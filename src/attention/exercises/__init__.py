"""Checkers for the exercises in which you write the function yourself.

Each chapter's exercises have their checkers in one module, ``ch01`` ... ``ch20``. Write
your function, then hand it to its checker, in the cell below the exercise::

    from attention.exercises import ch02

    def my_softmax(x, dim=-1):
        ...

    ch02.check_softmax(my_softmax)

The checker runs your function and the course's own on a few inputs, chosen to include
the usual traps (very large scores, ``-inf`` entries, the wrong axis ...). If they
agree, it prints one line starting with ``✓``. If not, it raises an
:class:`ExerciseError` whose one line says what is wrong and where: still a stub, an
exception and the line that raised it, a wrong shape or dtype, NaN or inf where the
answer is finite, the first index where the values differ, a rule that fails ("rows
must sum to 1"), or a known mistake by name ("the max shift is missing"). Your inputs
are never changed: every call gets fresh copies.

The workbook (``workbook/NN_name.ipynb``) holds each chapter with the solutions replaced
by stubs (their body raises ``NotImplementedError``); the book shows the solutions
behind a "Show solution" button.
"""

from ._checker import ExerciseError

__all__ = ["ExerciseError"]
