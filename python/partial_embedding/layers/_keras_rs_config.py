"""keras-rs's feature and table configs, read for ``DistributedEmbedding``.

keras-rs is optional: :func:`keras_rs_layers` imports it when a layer is made
(``import partial_embedding`` never does) and says what to install when it is
missing. :class:`FeaturePlan` walks a nested structure of
``keras_rs.layers.FeatureConfig`` once: each feature's path, its table (one per
distinct ``TableConfig`` object, keyed by the table's name) and the checks of
everything the default device cannot do. :func:`serialize_features` and
:func:`deserialize_features` write and read the structure with each table
once, referred to by index, so a shared table stays shared after a round trip.
Only keras-rs's public names are used (``FeatureConfig``, ``TableConfig`` and
their ``get_config`` / ``from_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops.bags import COMBINERS

__all__ = [
    "DEFAULT_DEVICE_PLACEMENTS",
    "INSTALL_HINT",
    "FeaturePlan",
    "describe",
    "deserialize_features",
    "keras_rs_layers",
    "per_table",
    "serialize_features",
]

INSTALL_HINT = (
    'pip install "tf-partial-embedding[keras-rs]" '
    "(or pip install keras-rs; it needs Python >= 3.11)"
)
#: Placements that mean "where the model's device puts it".
DEFAULT_DEVICE_PLACEMENTS = ("auto", "default_device")
_FEATURE_KEYS = {"name", "table", "input_shape", "output_shape"}


def keras_rs_layers() -> Any:
    """``keras_rs.layers``, imported now.

    Raises:
      ImportError: keras-rs is not installed; the message says what to install.
    """
    try:
        import keras_rs
    except ImportError as error:
        raise ImportError(
            f"partial_embedding.DistributedEmbedding needs keras-rs: {INSTALL_HINT}"
        ) from error
    return keras_rs.layers


def _path_name(path: tuple) -> str:
    """A feature's place in the nested structure, as ``"a"`` or ``"c.0"``."""
    return ".".join(str(part) for part in path) if path else "<root>"


def _check_table(table: Any, path: str) -> None:
    """Refuses what only SparseCore does, and values keras-rs refuses too."""
    where = f"table {table.name!r} (feature {path!r})"
    if table.placement == "sparsecore":
        raise PartialEmbeddingArgumentError(
            f"placement: {where} asks for 'sparsecore'; partial_embedding puts every table on "
            "the default device (the model's CPU or GPU), so use placement='auto' or "
            "'default_device', or keras_rs.layers.DistributedEmbedding on a TPU with SparseCore"
        )
    if table.placement not in DEFAULT_DEVICE_PLACEMENTS:
        raise PartialEmbeddingArgumentError(
            f"placement: {where} has placement {table.placement!r}; use 'auto' or 'default_device'"
        )
    if not isinstance(table.combiner, str) or table.combiner not in COMBINERS:
        raise PartialEmbeddingArgumentError(
            f"combiner: {where} has combiner {table.combiner!r}; use one of {COMBINERS}"
        )


class FeaturePlan:
    """The features of a nested ``FeatureConfig`` structure and their tables.

    Attributes:
      structure: The structure as given (its leaves ``FeatureConfig``).
      paths: Each feature's path name, in ``keras.tree.flatten`` order.
      features: The ``FeatureConfig`` of each path, in the same order.
      tables: Table name -> ``TableConfig``, one per distinct table.
      table_of_path: Path name -> the name of its table.
    """

    def __init__(self, feature_configs: Any, feature_config_class: Any) -> None:
        flat = keras.tree.flatten_with_path(feature_configs)
        if not flat:
            raise PartialEmbeddingArgumentError("feature_configs: no FeatureConfig in it")
        self.structure = feature_configs
        self.paths: list[str] = []
        self.features: list[Any] = []
        self.tables: dict[str, Any] = {}
        self.table_of_path: dict[str, str] = {}
        for path, feature in flat:
            name = _path_name(tuple(path))
            if not isinstance(feature, feature_config_class):
                raise PartialEmbeddingTypeError(
                    f"feature_configs: {name!r} is a {type(feature).__name__}, not a "
                    "keras_rs.layers.FeatureConfig (tf.tpu.experimental.embedding configs "
                    "are for TPUs with SparseCore)"
                )
            table = feature.table
            _check_table(table, name)
            known = self.tables.get(table.name)
            if known is not None and known is not table:
                raise PartialEmbeddingArgumentError(
                    f"feature_configs: two different TableConfig objects are named "
                    f"{table.name!r}; share one object between features, or name them apart"
                )
            self.tables[table.name] = table
            self.paths.append(name)
            self.features.append(feature)
            self.table_of_path[name] = table.name

    def check_structure(self, argument: str, value: Any) -> list[Any]:
        """``value``'s leaves, in path order, once its structure is the features'.

        Raises:
          PartialEmbeddingTypeError: another structure; names ``argument``.
        """
        try:
            keras.tree.assert_same_structure(self.structure, value)
        except (ValueError, TypeError) as error:
            raise PartialEmbeddingTypeError(
                f"{argument}: must have the structure of feature_configs (features "
                f"{self.paths}); got {describe(value)} ({str(error)[:160]})"
            ) from None
        return list(keras.tree.flatten(value))


def describe(value: Any) -> str:
    """A short account of a nested structure's shape, for error messages."""
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {sorted(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def per_table(argument: str, values: Any, tables: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (None or a mapping keyed by table name) as a dict.

    Raises:
      PartialEmbeddingTypeError: not a mapping.
      PartialEmbeddingArgumentError: a key that is no table's name.
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise PartialEmbeddingTypeError(
            f"{argument}: must be a dict keyed by table name (tables {sorted(tables)}); "
            f"got a {type(values).__name__}"
        )
    unknown = sorted(str(name) for name in values if name not in tables)
    if unknown:
        raise PartialEmbeddingArgumentError(
            f"{argument}: no table is named {', '.join(map(repr, unknown))}; "
            f"the tables are {sorted(tables)}"
        )
    return dict(values)


def serialize_features(plan: FeaturePlan) -> tuple[Any, list[dict[str, Any]]]:
    """The structure with each feature's table as an index, and the tables' configs."""
    tables: list[dict[str, Any]] = []
    index_of: dict[int, int] = {}

    def feature(config: Any) -> dict[str, Any]:
        if id(config.table) not in index_of:
            index_of[id(config.table)] = len(tables)
            tables.append(config.table.get_config())
        return {**config.get_config(), "table": index_of[id(config.table)]}

    return keras.tree.map_structure(feature, plan.structure), tables


def deserialize_features(structure: Any, tables: list[dict[str, Any]], classes: Any) -> Any:
    """What :func:`serialize_features` wrote, as ``FeatureConfig`` objects; the
    features of one table index share one ``TableConfig``."""
    table_objects: dict[int, Any] = {}

    def table(index: int) -> Any:
        if index not in table_objects:
            table_objects[index] = classes.TableConfig.from_config(dict(tables[index]))
        return table_objects[index]

    def walk(node: Any) -> Any:
        if (
            isinstance(node, Mapping)
            and set(node) == _FEATURE_KEYS
            and isinstance(node["name"], str)
        ):
            return classes.FeatureConfig(
                name=node["name"],
                table=table(int(node["table"])),
                input_shape=_shape(node["input_shape"]),
                output_shape=_shape(node["output_shape"]),
            )
        if isinstance(node, Mapping):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(value) for value in node)
        raise PartialEmbeddingTypeError(f"feature_configs: cannot read {node!r} as a feature")

    return walk(structure)


def _shape(shape: Any) -> Any:
    """A shape from a config (JSON gives lists) as a tuple."""
    return None if shape is None else tuple(shape)
