"""Conceptual diagrams of the chapters, drawn by code (one module per part of the book).

A chapter shows one in a code cell tagged ``diagram`` and ``remove-input`` (the reader
sees the picture, not its source), with alt text in the cell's metadata::

    from attention.course.diagrams import qkv_projection
    qkv_projection()
    plt.show()

Every function returns a matplotlib Figure drawn with the primitives of ``_draw.py``:
a light card readable in light and dark mode, at most 7.4 inches wide, titled, no text
below 8 pt, and its numbers and shapes computed by the package itself.
``tests/test_diagrams.py`` checks all of that for every function listed here.
"""

# ruff: noqa: F403  (each part's module lists its diagrams in its __all__)
from . import efficient, foundations, layers, practice, reading
from .efficient import *  # chapters 10-16
from .foundations import *  # chapters 1-4
from .layers import *  # chapters 5-9
from .practice import *  # chapters 17-18
from .reading import *  # chapters 19-20

# every diagram of every part, for tests/test_diagrams.py and the chapters; a part's
# module adds its two lines above and its `__all__ +=` line here (a form pyright reads)
__all__: list[str] = []
__all__ += foundations.__all__
__all__ += layers.__all__
__all__ += efficient.__all__
__all__ += practice.__all__
__all__ += reading.__all__
