"""Moved: ``python -m partial_embedding.demo --lm`` (``partial_embedding.demo.lm``)."""

from partial_embedding.demo import lm
from partial_embedding.demo.lm import *  # noqa: F403  (the old names, still importable here)
from partial_embedding.demo.lm import __all__ as __all__

if __name__ == "__main__":
    raise SystemExit(lm.main())
