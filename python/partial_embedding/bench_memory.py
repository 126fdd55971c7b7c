"""Moved: ``python -m partial_embedding.bench --memory`` (``partial_embedding.bench.memory``)."""

from partial_embedding.bench import memory
from partial_embedding.bench.memory import *  # noqa: F403  (the old names, still importable here)
from partial_embedding.bench.memory import __all__ as __all__

if __name__ == "__main__":
    memory.main()
