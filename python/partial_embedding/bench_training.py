"""Moved: ``python -m partial_embedding.bench --training`` (module ``bench.training``)."""

from partial_embedding.bench import training
from partial_embedding.bench.training import *  # noqa: F403  (the old names, still importable here)
from partial_embedding.bench.training import __all__ as __all__

if __name__ == "__main__":
    training.main()
