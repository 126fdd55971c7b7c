"""Moved: ``python -m partial_embedding.bench --training`` (module ``bench.training``)."""

from partial_embedding.bench import training

if __name__ == "__main__":
    training.main()
