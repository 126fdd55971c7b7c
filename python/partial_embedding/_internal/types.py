"""Named aliases for the types the public signatures take.

TensorFlow and Keras ship no type information, so these are documentation
for readers and for mypy's view of our own code: each names what an argument
means, not a checked type.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Union

import numpy as np

#: Row ids: a Python or NumPy sequence of integers, a set or range, an integer
#: tensor; or, where a mask is accepted, a bool array of one entry per row.
RowIds = Union[Iterable[int], np.ndarray, Any]

#: A row mask: a bool ``[V]`` array, tensor or variable (True = may be written).
RowMask = Union[np.ndarray, Any]

#: A TensorFlow or Keras variable (a table, a mask, a slot), possibly
#: distributed (mirrored, sharded).
Variable = Any

#: A tensor or anything ``tf.convert_to_tensor`` accepts.
TensorLike = Any

#: An embedding table's values: a ``[V, D]`` array, tensor, memory-mapped
#: ``.npy`` or variable.
Table = Union[np.ndarray, Any]

#: A Keras initializer: a name, a config dict, an instance or a callable.
Initializer = Union[str, dict, Any]

#: A Keras optimizer instance.
KerasOptimizer = Any

#: A path to a file: ``str``, ``bytes`` or ``os.PathLike``.
PathLike = Union[str, bytes, "os.PathLike[str]"]

#: A Keras layer (or model) instance.
KerasLayer = Any

#: A Keras model, or a keras-hub backbone or task model.
KerasModel = Any

#: A vocabulary: a list of tokens, or a ``StringLookup`` / ``TextVectorization`` layer.
Vocabulary = Union[Iterable[str], Any]

#: Pretrained vectors: gensim ``KeyedVectors``, ``(tokens, array)``, or a dict of token -> vector.
PretrainedVectors = Union[dict, tuple, Any]

#: New tokens: a count, token strings, or existing row ids.
NewTokens = Union[int, Iterable[str], Iterable[int], np.ndarray]

#: A hyperparameter: a Python number, a scalar tensor or a variable.
Scalar = Union[float, int, Any]
