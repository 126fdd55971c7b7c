"""Runnable examples: ``python -m partial_embedding.examples.<name>``.

docs/layout.md lists them.
"""

__all__: list[str] = []
