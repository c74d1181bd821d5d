"""attention: the tested package behind the course "Attention, line by line".

Mask convention everywhere: boolean, True = may attend, broadcastable to ``(b, h, i, j)``
(as in ``torch.nn.functional.scaled_dot_product_attention``); float masks are added to
the scores.

This facade re-exports each module's ``__all__``, one line per module, in the order the
chapters teach them; adding a module is adding its line. Helpers that one chapter uses
(``attention.softmax.softmax_jacobian``, ``attention.masks.decoding_mask``,
``attention.kv_cache.kv_cache_bytes_per_token``, the score functions of
``attention.scoring`` ...) are imported from their module, and so is chapter 08's toy
translation task, ``attention.seq2seq``. ``attention.pretrained`` imports transformers
only when called. ``tests/test_facade.py`` checks that ``__all__`` is exactly the union of
the re-exported modules' ``__all__``.
"""

from types import ModuleType as _ModuleType

# ruff: noqa: I001  (the imports follow the reading order, not the alphabet)
from .notebook import *  # noqa: F403  set-up and checks of every chapter
from .plotting import *  # noqa: F403  figures of every chapter
from .softmax import *  # noqa: F403  chapter 02
from .scaled_dot_product import *  # noqa: F403  chapters 01-04
from .masks import *  # noqa: F403  chapter 04
from .self_attention import *  # noqa: F403  chapter 05
from .multihead import *  # noqa: F403  chapter 06
from .kv_cache import *  # noqa: F403  chapter 06
from .positional import *  # noqa: F403  chapter 07
from .dual_chunk import *  # noqa: F403  chapter 07
from .cross_attention import *  # noqa: F403  chapter 08
from .scoring import *  # noqa: F403  chapter 09
from .alignment import *  # noqa: F403  chapter 09
from .additive import *  # noqa: F403  chapter 09
from .feature_maps import *  # noqa: F403  chapter 10
from .linear import *  # noqa: F403  chapter 10
from .delta_rule import *  # noqa: F403  chapter 11
from .neural_memory import *  # noqa: F403  chapter 11
from .mqar import *  # noqa: F403  chapter 11
from .patterns import *  # noqa: F403  chapter 12
from .sparse import *  # noqa: F403  chapter 12
from .approximate import *  # noqa: F403  chapter 12
from .learned_sparse import *  # noqa: F403  chapter 13 (sparse attention, renumbered)
from .tiled import *  # noqa: F403  chapter 13
from .distributed import *  # noqa: F403  chapter 14
from .sinks import *  # noqa: F403  chapter 16
from .latent import *  # noqa: F403  chapter 16
from .paged import *  # noqa: F403  chapter 16
from .logits import *  # noqa: F403  chapter 16
from .pretrained import *  # noqa: F403  chapter 17
from .head_stats import *  # noqa: F403  chapter 17
from .circuits import *  # noqa: F403  chapter 18
from .weights import *  # noqa: F403  chapter 19
# chapters 01-08's running example; last, since it builds on pretrained and a module
# imported early would take an earlier slot in __all__
from .example import *  # noqa: F403  chapters 01-08

__version__ = "0.1.0"

# Every public name bound above, in reading order (the star imports bind exactly each
# module's __all__; the submodules themselves, bound as attributes, are left out).
__all__ = [
    name
    for name, value in dict(globals()).items()
    if not name.startswith("_") and not isinstance(value, _ModuleType)
]
