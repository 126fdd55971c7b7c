"""``DistributedEmbedding``: keras-rs's configs, our bag tables.

A drop-in for ``keras_rs.layers.DistributedEmbedding`` on the TensorFlow
backend, for tables on the default device (a CPU or GPU). It takes the same
nested ``FeatureConfig`` / ``TableConfig`` structure and the same
``call(inputs, weights=None, training=...)``, ``preprocess``,
``get_embedding_tables``, ``compute_output_shape`` and config, and builds each
table as a ``PartialEmbedding`` with the table's combiner, so
``MaskedOptimizer`` runs its fused bag gradient and rule, and
``trainable_ids`` / ``admission`` name the rows that learn, per table.

It stands beside keras-rs's class (a ``keras.layers.Layer``) rather than
subclassing it. keras-rs's public surface is its constructor, ``call``,
``preprocess``, ``get_embedding_tables``, ``compute_output_shape`` and the
config; the default-device path lives in private methods
(``_default_device_init``, ``_default_device_call``, ...) and attributes whose
names and signatures keras-rs may change in any release. A subclass would
have to override them (a rename would silently bring back keras-rs's own
``Embedding`` tables) or re-implement the public methods anyway. Standing
beside it, we depend on the two config dataclasses and their
``get_config`` / ``from_config`` alone, and keras-rs is imported only when a
layer is made. The differences from keras-rs, each with its reason:
docs/keras_rs.md.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.layers import _keras_rs_config as config_io
from partial_embedding.layers._admission import RowAdmission, checked_admission
from partial_embedding.layers._bags import layer_bags
from partial_embedding.layers.embedding import PartialEmbedding

__all__ = ["DistributedEmbedding"]

#: The key ``preprocess`` nests its output under (keras-rs's, so that code
#: which tells preprocessed inputs apart by it keeps working).
PREPROCESSED = "preprocessed_inputs_per_placement"
_DEVICE = "default_device"


def _table_layer(table: Any, trainable_ids: Any, admission: Any, dtype: Any) -> PartialEmbedding:
    """The bag table of one ``TableConfig``; argument errors name the table."""
    try:
        return PartialEmbedding(
            table.vocabulary_size,
            table.embedding_dim,
            trainable_ids=trainable_ids,
            embeddings_initializer=table.initializer,
            combiner=table.combiner,
            admission=checked_admission(admission),
            name=table.name,
            dtype=dtype,
        )
    except PartialEmbeddingTypeError as error:
        raise PartialEmbeddingTypeError(f"table {table.name!r}: {error}") from error
    except ValueError as error:
        raise PartialEmbeddingArgumentError(f"table {table.name!r}: {error}") from error


def _check_shape(feature: Any, path: str, shape: Any) -> None:
    """Refuses an input shape that is not the feature's ``input_shape`` (rank,
    and every dimension known in both)."""
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(d, (int, type(None))) for d in shape
    ):
        raise PartialEmbeddingArgumentError(f"inputs: feature {path!r} has shape {shape!r}")
    expected = tuple(feature.input_shape)
    compatible = len(shape) == len(expected) and all(
        a is None or b is None or a == b for a, b in zip(shape, expected)
    )
    if not shape or not compatible:
        raise PartialEmbeddingArgumentError(
            f"inputs: feature {path!r} has shape {tuple(shape)}, but its FeatureConfig's "
            f"input_shape is {expected}"
        )


def _rank(value: Any) -> int | None:
    if isinstance(value, tf.SparseTensor):
        return int(value.shape.rank) if value.shape.rank is not None else None
    return value.shape.rank


def _bag_inputs(ids: Any, weights: Any, combiner: str, path: str) -> tuple[Any, Any]:
    """A feature's ids and weights as bags: 1-D ids are bags of one id (whose
    weight only ``sum`` uses, as keras-rs's ``EmbedReduce`` does)."""
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        ids = tf.convert_to_tensor(ids)
    rank = _rank(ids)
    if rank == 1:
        ids = tf.expand_dims(ids, -1)
        if weights is not None and combiner == "sum":
            weights = tf.expand_dims(tf.convert_to_tensor(weights), -1)
        else:
            weights = None
    elif rank != 2:
        raise PartialEmbeddingArgumentError(
            f"inputs: feature {path!r} has ids of rank {rank}; a feature takes rank 1 (one id "
            "per example) or 2 (a bag per example: dense, ragged or sparse)"
        )
    return ids, weights


def _shared_lookup(
    layer: PartialEmbedding, bag_inputs: list[tuple[Any, Any]], training: Any
) -> list[Any]:
    """The outputs of several features of one table, from one bag lookup.

    The features' bags, one after another, are one ragged batch (each bag's
    ids, weights and pooling as in its own lookup; a feature without weights
    gets weights of 1, which every combiner pools as none); the table looks
    it up once and the pooled rows are split back per feature. So the
    table's gradient is one bag lookup's, which ``MaskedOptimizer`` steps
    with its fused bag gradient + rule, as a table of one feature.
    """
    bags = [layer_bags(layer, ids, weights) for ids, weights in bag_inputs]
    id_dtype = tf.int64 if any(b.ids.dtype == tf.int64 for b in bags) else tf.int32
    with_weights = [b.weights for b in bags if b.weights is not None]
    weight_dtype = tf.float64 if any(w.dtype == tf.float64 for w in with_weights) else tf.float32
    sizes = [b.num_bags for b in bags]
    static_sizes = [b.static_num_bags for b in bags]
    starts = tf.cumsum(tf.stack(sizes), exclusive=True)
    rowids = tf.concat([b.bags + starts[i] for i, b in enumerate(bags)], 0)
    ids = tf.concat([tf.cast(b.ids, id_dtype) for b in bags], 0)
    known = [size for size in static_sizes if size is not None]
    total = sum(known) if len(known) == len(bags) else tf.add_n(sizes)
    ragged_ids = tf.RaggedTensor.from_value_rowids(ids, rowids, nrows=total, validate=False)
    ragged_weights = None
    if with_weights:
        weights = tf.concat(
            [
                tf.ones_like(b.ids, weight_dtype)
                if b.weights is None
                else tf.cast(b.weights, weight_dtype)
                for b in bags
            ],
            0,
        )
        ragged_weights = ragged_ids.with_values(weights)
    pooled = layer(ragged_ids, ragged_weights, training=training)
    if len(known) == len(bags):
        return tf.split(pooled, known)
    return tf.split(pooled, tf.stack(sizes), num=len(bags))


@keras.saving.register_keras_serializable(package="partial_embedding")
class DistributedEmbedding(keras.layers.Layer):
    """keras-rs's ``DistributedEmbedding`` on our bag tables: swap the class, name the rows.

    Takes the nested ``keras_rs.layers.FeatureConfig`` structure of
    ``keras_rs.layers.DistributedEmbedding`` (a table may serve several
    features) and gives the same outputs, one ``[batch, embedding_dim]``
    vector per feature. Each table is a ``PartialEmbedding`` with the table's
    ``combiner``, ``initializer``, ``vocabulary_size`` and ``embedding_dim``,
    on the model's device; train with ``partial_embedding.MaskedOptimizer``.
    ``TableConfig.optimizer`` is kept in the config but not used, as
    keras-rs does off SparseCore: the model's optimizer trains every table.
    Needs keras-rs (``pip install "tf-partial-embedding[keras-rs]"``).
    Differences from keras-rs, with reasons: docs/keras_rs.md.

    Args:
      feature_configs: A nested structure (dicts, lists, tuples) of
        ``keras_rs.layers.FeatureConfig``.
      trainable_ids: Table name -> the rows that learn (ids or a bool mask);
        tables left out, or None: every row learns.
      admission: Table name -> a ``partial_embedding.RowAdmission``.
      table_stacking: Accepted and unused (SparseCore only).
      update_stats: Must be False (keras-rs: JAX only).
      **kwargs: Base layer arguments (``name``, ``dtype``, ...).

    Raises:
      ImportError: keras-rs is not installed.
      PartialEmbeddingArgumentError: a ``"sparsecore"`` table, an unknown
        table name in ``trainable_ids`` / ``admission``, a bad id.
      PartialEmbeddingTypeError: a leaf that is not a ``FeatureConfig``.

    >>> import keras_rs, numpy as np, partial_embedding as pe
    >>> table = keras_rs.layers.TableConfig("items", vocabulary_size=100, embedding_dim=8)
    >>> features = {
    ...     "clicked": keras_rs.layers.FeatureConfig("clicked", table, (4, 3), (4, 8)),
    ...     "shown": keras_rs.layers.FeatureConfig("shown", table, (4,), (4, 8)),
    ... }
    >>> layer = pe.DistributedEmbedding(features, trainable_ids={"items": range(90, 100)})
    >>> out = layer({"clicked": np.ones((4, 3), "int32"), "shown": np.arange(4)})
    >>> out["clicked"].shape, out["shown"].shape
    (TensorShape([4, 8]), TensorShape([4, 8]))
    >>> layer.table_layer("items").trainable_ids.tolist()[:3]
    [90, 91, 92]
    """

    __module__ = "partial_embedding.layers"

    built: bool

    def __init__(
        self,
        feature_configs: Any,
        *,
        trainable_ids: dict[str, Any] | None = None,
        admission: dict[str, RowAdmission] | None = None,
        table_stacking: Any = "auto",
        update_stats: bool = False,
        **kwargs: Any,
    ) -> None:
        classes = config_io.keras_rs_layers()
        if update_stats:
            raise PartialEmbeddingArgumentError(
                "update_stats: True is for keras-rs on JAX with SparseCore; pass False"
            )
        plan = config_io.FeaturePlan(feature_configs, classes.FeatureConfig)
        trainable = config_io.per_table("trainable_ids", trainable_ids, plan.tables)
        admissions = config_io.per_table("admission", admission, plan.tables)
        super().__init__(**kwargs)
        self.table_stacking = table_stacking
        self._plan = plan
        self._tables = {
            name: _table_layer(table, trainable.get(name), admissions.get(name), self.dtype_policy)
            for name, table in plan.tables.items()
        }
        self._admissions: dict[str, RowAdmission] = {
            name: layer.admission
            for name, layer in self._tables.items()
            if layer.admission is not None
        }

    @property
    def feature_configs(self) -> Any:
        """The nested ``FeatureConfig`` structure, as given."""
        return self._plan.structure

    def table_layer(self, name: str) -> PartialEmbedding:
        """The ``PartialEmbedding`` of table ``name`` (to freeze, unfreeze or
        read its ``trainable_ids``).

        Raises:
          PartialEmbeddingArgumentError: no table is named ``name``.
        """
        if name not in self._tables:
            raise PartialEmbeddingArgumentError(
                f"name: no table is named {name!r}; the tables are {sorted(self._tables)}"
            )
        return self._tables[name]

    def build(self, input_shapes: Any = None) -> None:
        if self.built:
            return
        if input_shapes is not None and not self._is_preprocessed(input_shapes):
            self._verify_shapes(input_shapes)
        for layer in self._tables.values():
            layer.build()
        self.built = True

    def _verify_shapes(self, input_shapes: Any) -> None:
        plan = self._plan
        shapes: list[Any] = []
        try:
            keras.tree.map_structure_up_to(
                plan.structure, lambda _, shape: shapes.append(shape), plan.structure, input_shapes
            )
        except (ValueError, TypeError) as error:
            raise PartialEmbeddingTypeError(
                f"inputs: must have the structure of feature_configs (features {plan.paths}); "
                f"got {config_io.describe(input_shapes)} ({str(error)[:160]})"
            ) from None
        for path, feature, shape in zip(plan.paths, plan.features, shapes):
            _check_shape(feature, path, shape)

    @staticmethod
    def _is_preprocessed(inputs: Any) -> bool:
        return isinstance(inputs, dict) and PREPROCESSED in inputs

    def preprocess(self, inputs: Any, weights: Any = None, training: bool = False) -> Any:
        """The inputs (and weights) checked and keyed by feature path, for ``call``.

        Optional on this device, as in keras-rs: ``call`` takes either.
        ``training`` is unused (keras-rs uses it on SparseCore).

        Raises:
          PartialEmbeddingTypeError: ``inputs`` or ``weights`` without the
            structure of ``feature_configs``.
        """
        del training
        flat_inputs = self._plan.check_structure("inputs", inputs)
        if not self.built:
            self.build(keras.tree.map_structure(lambda x: tuple(x.shape), inputs))
        placed: dict[str, Any] = {"inputs": dict(zip(self._plan.paths, flat_inputs))}
        if weights is not None:
            flat_weights = self._plan.check_structure("weights", weights)
            placed["weights"] = dict(zip(self._plan.paths, flat_weights))
        return {PREPROCESSED: {_DEVICE: placed}}

    def call(self, inputs: Any, weights: Any = None, training: Any = False) -> Any:
        if not self._is_preprocessed(inputs):
            inputs = self.preprocess(inputs, weights)
        placed = inputs[PREPROCESSED][_DEVICE]
        ids_of, weights_of = placed["inputs"], placed.get("weights") or {}
        paths_of: dict[str, list[str]] = {}
        for path, feature in zip(self._plan.paths, self._plan.features):
            paths_of.setdefault(feature.table.name, []).append(path)
        output_of: dict[str, Any] = {}
        for name, paths in paths_of.items():
            layer = self._tables[name]
            combiner = self._plan.tables[name].combiner
            bag_inputs = [
                _bag_inputs(ids_of[path], weights_of.get(path), combiner, path) for path in paths
            ]
            if len(paths) == 1:
                output_of[paths[0]] = layer(*bag_inputs[0], training=training)
            else:
                output_of.update(zip(paths, _shared_lookup(layer, bag_inputs, training)))
        outputs = [output_of[path] for path in self._plan.paths]
        return keras.tree.pack_sequence_as(self._plan.structure, outputs)

    def compute_output_shape(self, input_shapes: Any) -> Any:
        if not self._is_preprocessed(input_shapes):
            self._verify_shapes(input_shapes)
        return keras.tree.map_structure(
            lambda feature: tuple(feature.output_shape), self._plan.structure
        )

    def compute_output_spec(self, inputs: Any, weights: Any = None, training: Any = None) -> Any:
        if not self._is_preprocessed(inputs):
            self._plan.check_structure("inputs", inputs)
            self._verify_shapes(keras.tree.map_structure(lambda x: tuple(x.shape), inputs))
        return keras.tree.map_structure(
            lambda feature: keras.KerasTensor(
                tuple(feature.output_shape), dtype=self.compute_dtype
            ),
            self._plan.structure,
        )

    def get_embedding_tables(self) -> dict[str, Any]:
        """Table name -> the table's values now (a tensor, not the variable);
        builds the tables first if the layer is not built."""
        if not self.built:
            self.build()
        return {
            name: tf.convert_to_tensor(layer.embeddings) for name, layer in self._tables.items()
        }

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = super().get_config()
        structure, tables = config_io.serialize_features(self._plan)
        # The rows that learn are state (each table's saved trainable_mask),
        # not config, as in PartialEmbedding.
        config.update(
            feature_configs=structure,
            tables=tables,
            table_stacking=self.table_stacking,
        )
        if self._admissions:
            config["admission"] = {
                name: value.get_config() for name, value in self._admissions.items()
            }
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DistributedEmbedding:
        config = dict(config)
        classes = config_io.keras_rs_layers()
        config["feature_configs"] = config_io.deserialize_features(
            config["feature_configs"], config.pop("tables"), classes
        )
        return cls(**config)
