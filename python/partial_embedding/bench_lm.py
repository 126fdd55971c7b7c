"""Moved: ``python -m partial_embedding.bench --lm`` (``partial_embedding.bench.lm``)."""

from partial_embedding.bench import lm

if __name__ == "__main__":
    lm.main()
