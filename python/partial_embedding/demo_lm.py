"""Moved: ``python -m partial_embedding.demo --lm`` (``partial_embedding.demo.lm``)."""

from partial_embedding.demo import lm

if __name__ == "__main__":
    raise SystemExit(lm.main())
