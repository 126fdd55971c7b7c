"""Moved: ``python -m partial_embedding.bench --lm`` (``partial_embedding.bench.lm``)."""

from partial_embedding.bench import lm
from partial_embedding.bench.lm import *  # noqa: F403  (the old names, still importable here)
from partial_embedding.bench.lm import __all__ as __all__

if __name__ == "__main__":
    lm.main()
