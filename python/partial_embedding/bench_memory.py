"""Moved: ``python -m partial_embedding.bench --memory`` (``partial_embedding.bench.memory``)."""

from partial_embedding.bench import memory

if __name__ == "__main__":
    memory.main()
