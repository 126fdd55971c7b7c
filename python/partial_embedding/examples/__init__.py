"""Runnable examples: ``python -m partial_embedding.examples.<name>``.

``parameter_server``: ``ParameterServerStrategy`` training of a sharded
``PartialEmbedding`` with ``MaskedOptimizer`` on a localhost cluster of real
processes (2 parameter servers, 2 workers and the coordinator).
"""

__all__: list[str] = []
