"""keras-hub backbones whose token embedding is a partial layer.

Every keras-hub backbone builds its token embedding as a stock Keras layer
inside its constructor, assigns it to ``self.token_embedding`` and then calls
it in its functional graph. A subclass of the backbone's class (same name,
registered with Keras under ``partial_embedding.keras_hub``) overrides
``__setattr__`` for that one name: the stock layer assigned is replaced,
before Keras tracks it, by a partial one (``PartialReversibleEmbedding`` for a
``ReversibleEmbedding``, tied or not; ``PartialEmbedding`` for a plain
``Embedding``), so the graph is built around the partial layer and nothing
else changes. Because this depends on how a backbone's constructor assigns
and uses the layer, every rebuilt backbone is checked (``check_swapped``):
its ``token_embedding`` must be the partial layer, its graph must call it,
and no stock embedding of that name may remain in the graph.

The subclass is registered for every backbone class ``keras_hub.models``
exports when ``partial_embedding.keras_hub`` is imported, so a ``.keras`` file
of a rebuilt model loads with ``keras.saving.load_model`` and no
``custom_objects``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import keras
import keras_hub

from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.layers import PartialEmbedding, PartialReversibleEmbedding

__all__ = [
    "REGISTERED_PACKAGE",
    "check_swapped",
    "partial_class",
    "register_all",
    "stock_class",
    "prepared_token_embedding",
]

REGISTERED_PACKAGE = "partial_embedding.keras_hub"

# The layer add_tokens prepared for the backbone being built (None: convert
# the stock layer as it comes, as when a saved model is loaded).
_PREPARED: contextvars.ContextVar[Any] = contextvars.ContextVar("prepared", default=None)
_CLASSES: dict[type, type] = {}


def _partial_of(stock_layer: Any) -> Any:
    prepared = _PREPARED.get()
    if prepared is not None:
        if prepared.input_dim != stock_layer.input_dim:
            raise PartialEmbeddingArgumentError(
                f"token_embedding: the backbone built {stock_layer.input_dim} rows, "
                f"the prepared table has {prepared.input_dim}"
            )
        return prepared
    if isinstance(stock_layer, keras.layers.ReversibleEmbedding):
        return PartialReversibleEmbedding.from_layer(stock_layer, init=None)
    return PartialEmbedding.from_layer(stock_layer, init=None)


def _is_stock_embedding(layer: Any) -> bool:
    return isinstance(layer, keras.layers.Embedding) and not isinstance(layer, PartialEmbedding)


def _swapping_setattr(backbone_class: type) -> Any:
    """A ``__setattr__`` that hands a partial layer on where a stock token embedding comes."""

    def setattr_swapping(backbone: Any, name: str, value: Any) -> None:
        if name == "token_embedding" and _is_stock_embedding(value):
            # Swapped before Keras tracks it: the stock layer is never tracked.
            value = _partial_of(value)
        backbone_class.__setattr__(backbone, name, value)  # type: ignore[call-arg]

    return setattr_swapping


def stock_class(backbone_class: type) -> Any:
    """The keras-hub class a (possibly partial) backbone class stands for."""
    for stock, partial in _CLASSES.items():
        if partial is backbone_class:
            return stock
    return backbone_class


def partial_class(backbone_class: type) -> Any:
    """The registered subclass of ``backbone_class`` that holds a partial token embedding.

    Raises:
      PartialEmbeddingTypeError: not a ``keras_hub.models.Backbone`` class,
        or one whose ``token_embedding`` is not the base class's property.
    """
    backbone_class = stock_class(backbone_class)
    if backbone_class in _CLASSES:
        return _CLASSES[backbone_class]
    token_property = getattr(backbone_class, "token_embedding", None)
    if not (
        isinstance(backbone_class, type)
        and issubclass(backbone_class, keras_hub.models.Backbone)
        and isinstance(token_property, property)
        and token_property.fset is not None
    ):
        raise PartialEmbeddingTypeError(
            f"{getattr(backbone_class, '__name__', backbone_class)}: not a keras-hub "
            "Backbone whose token_embedding can be assigned"
        )
    namespace = {
        "__setattr__": _swapping_setattr(backbone_class),
        "__module__": REGISTERED_PACKAGE,
        "__doc__": f"A {backbone_class.__name__} whose token embedding trains only chosen rows.",
    }
    subclass = type(backbone_class.__name__, (backbone_class,), namespace)
    _CLASSES[backbone_class] = subclass
    registered: type = keras.saving.register_keras_serializable(
        package=REGISTERED_PACKAGE, name=backbone_class.__name__
    )(subclass)
    return registered


def register_all() -> None:
    """Registers the partial subclass of every backbone ``keras_hub.models`` exports."""
    for value in vars(keras_hub.models).values():
        if isinstance(value, type) and issubclass(value, keras_hub.models.Backbone):
            with contextlib.suppress(PartialEmbeddingTypeError):
                partial_class(value)


@contextlib.contextmanager
def prepared_token_embedding(layer: Any) -> Iterator[None]:
    """Within it, a partial backbone's constructor takes ``layer`` as its token embedding."""
    token = _PREPARED.set(layer)
    try:
        yield
    finally:
        _PREPARED.reset(token)


def check_swapped(backbone: Any, expected: Any) -> None:
    """Checks that ``backbone``'s graph calls ``expected`` and no stock embedding of its name.

    Raises:
      PartialEmbeddingTypeError: the backbone's constructor did not take the
        partial layer (its class builds the token embedding another way).
    """
    in_graph = [layer for layer in backbone.layers if layer is expected]
    stale = [
        layer
        for layer in backbone.layers
        if _is_stock_embedding(layer) and layer.name == expected.name
    ]
    if backbone.token_embedding is not expected or not in_graph or stale:
        raise PartialEmbeddingTypeError(
            f"{type(backbone).__name__}: its constructor does not build its graph "
            "around the layer assigned to token_embedding; this backbone is not supported"
        )
