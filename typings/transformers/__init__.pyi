# A stand-in for transformers' types, so that pyright does not parse the ~3,000 modules
# the real package pulls in (they tripled `make check`'s type-checking time). Every name
# is Any: the package only calls AutoModel/AutoTokenizer and reads their outputs.
from typing import Any

def __getattr__(name: str) -> Any: ...
