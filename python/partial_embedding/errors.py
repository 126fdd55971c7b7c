"""Exceptions raised for bad arguments.

TensorFlow reports bad input at run time as ``tf.errors.InvalidArgumentError``
and Python code usually raises ``ValueError``. Our Python-side checks raise an
error that is both, so callers can catch whichever they are used to.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = [
    "KerasVersionError",
    "PartialEmbeddingArgumentError",
    "PartialEmbeddingTypeError",
    "TensorFlowVersionError",
]


class PartialEmbeddingArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """A bad argument, found before anything was written.

    Both a ``tf.errors.InvalidArgumentError`` and a ``ValueError``.
    """

    # AutoGraph re-raises errors that carry this flag unchanged.
    ag_pass_through = True

    def __init__(self, *args: object) -> None:
        # Raised by us as Error(message); Keras and TensorFlow may rebuild it
        # with TensorFlow's signature (node_def, op, message, *extra).
        if len(args) == 1:
            args = (None, None, args[0])
        node_def, op, message, *extra = args
        tf.errors.InvalidArgumentError.__init__(self, node_def, op, message, *extra)

    def __str__(self) -> str:
        return self.message


class PartialEmbeddingTypeError(PartialEmbeddingArgumentError, TypeError):
    """An argument of the wrong kind or dtype; also a ``TypeError``."""


class TensorFlowVersionError(ImportError):
    """The installed TensorFlow is not the release the op library was built for."""


class KerasVersionError(ImportError):
    """The installed Keras is not a release this package is tested with."""
