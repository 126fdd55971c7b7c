"""Every private member of Keras and TensorFlow the package reaches, in one place.

No other module of the package names a private Keras or TensorFlow member
(``tests/package/test_framework_private.py`` walks the package's syntax trees
to enforce it). :func:`check_framework` looks for all of them at once and
raises one error naming every one that is missing, with the versions.

MaskedOptimizer runs the wrapped optimizer's own pipeline (empty-gradient
filtering, clipping, weight decay, the dense update step) and reads its slot
variables. Keras has no public API for these, so the wrapper calls private
methods and attributes of ``keras.optimizers.Optimizer``. Each one is named in
the lists below and reached through the functions of this module, nowhere
else. :func:`check_keras_internals` looks for them on the installed Keras
when a MaskedOptimizer is constructed (and :func:`check_built` when it is
built), so a Keras release that renames one fails there with one message
naming what is missing, not inside a training step.
``tests/package/test_keras_internals.py`` asserts that every listed member exists.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import keras
import tensorflow as tf

# The Keras release line these members were read from (and tested with).
from partial_embedding._version import TESTED_KERAS_LINES

# Keeps MaskedOptimizer.build from tracking the attributes it sets, as the
# base class' build does.
_TRACKING_DECORATOR = ("keras.src.utils.tracking", "no_automatic_dependency_tracking")

#: Functions of Keras modules: ``(module, name)``.
MODULE_FUNCTIONS: tuple[tuple[str, str], ...] = (_TRACKING_DECORATOR,)

#: Methods of ``keras.optimizers.Optimizer`` (the TensorFlow backend's).
OPTIMIZER_METHODS: tuple[str, ...] = (
    "_var_key",
    "_get_variable_index",
    "_check_variables_are_known",
    "_filter_empty_gradients",
    "_overwrite_variables_directly_with_gradients",
    "_overwrite_variable_with_gradient",
    "_clip_gradients",
    "_use_weight_decay",
    "_apply_weight_decay",
    "_backend_update_step",
)

#: Attributes every optimizer sets in its constructor.
OPTIMIZER_ATTRIBUTES: tuple[str, ...] = ("_trainable_variables",)

#: Attributes of ``keras.optimizers.LossScaleOptimizer`` that the wrapper's
#: loss scaling reads and writes (public names, but not documented API): set
#: by its constructor, and by its ``build``.
LOSS_SCALE_ATTRIBUTES: tuple[str, ...] = ("inner_optimizer", "dynamic_growth_steps")
LOSS_SCALE_BUILT_ATTRIBUTES: tuple[str, ...] = ("step_counter", "dynamic_scale")

#: The slot lists each optimizer's ``build`` creates (one entry per trained
#: variable), by the slot's name in the row rules: ``(attribute, option)``,
#: where ``build`` creates the list only when the option is set.
SLOT_LISTS: dict[type, dict[str, tuple[str, str | None]]] = {
    keras.optimizers.SGD: {"momentum": ("momentums", None)},
    keras.optimizers.Adam: {  # and AdamW, its subclass
        "momentum": ("_momentums", None),
        "velocity": ("_velocities", None),
        "velocity_hat": ("_velocity_hats", "amsgrad"),
    },
    keras.optimizers.Adagrad: {"accumulator": ("_accumulators", None)},
    keras.optimizers.RMSprop: {
        "velocity": ("_velocities", None),
        "momentum": ("_momentums", None),
        "average_gradient": ("_average_gradients", None),
    },
    keras.optimizers.Ftrl: {
        "accumulator": ("_accumulators", None),
        "linear": ("_linears", None),
    },
}


class IncompatibleKerasError(ImportError):
    """The installed Keras or TensorFlow lacks a private member the package relies on."""


_MISSING = object()


def _lookup(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, _MISSING)
    except ImportError:
        return _MISSING


def slot_lists_of(optimizer_class: type) -> dict[str, tuple[str, str | None]]:
    """The ``SLOT_LISTS`` entry of ``optimizer_class`` or of its nearest base;
    the package's own optimizers (``RowwiseAdagrad``, ``RowwiseAdam``) declare
    theirs as a class attribute ``SLOT_LISTS``."""
    own = getattr(optimizer_class, "SLOT_LISTS", None)
    if isinstance(own, dict):
        return own
    for cls in optimizer_class.__mro__:
        if cls in SLOT_LISTS:
            return SLOT_LISTS[cls]
    return {}


def missing_members(label: str, owner: Any, names: Iterable[str]) -> list[str]:
    """``label.name`` for each of ``names`` that ``owner`` (a class, module
    or instance) lacks."""
    return [f"{label}.{name}" for name in names if not hasattr(owner, name)]


def raise_if_missing(missing: list[str]) -> None:
    """Raises one IncompatibleKerasError naming every missing member."""
    if missing:
        raise IncompatibleKerasError(
            f"partial_embedding cannot run on the installed Keras {keras.version()} with "
            f"TensorFlow {tf.__version__}: it relies on private members these releases "
            f"lack: {', '.join(missing)}. It is tested on Keras {', '.join(TESTED_KERAS_LINES)}."
        )


#: Private members of Keras and TensorFlow outside the optimizer's pipeline:
#: ``(module, dotted attribute path)``.
FRAMEWORK_MEMBERS: tuple[tuple[str, str], ...] = (
    # Whether Keras runs a stateless call (model.stateless_call): no public predicate.
    ("keras.src.backend", "in_stateless_scope"),
    # Whether a graph is being built for XLA: no public predicate.
    ("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext"),
    # Whether a function is being traced for a SavedModel: no public predicate.
    ("tensorflow.python.saved_model.save_context", "in_save_context"),
    # Wraps a list of trackables for saving (sharded tables' checkpoint children).
    ("tensorflow", "__internal__.tracking.wrap"),
    # Runs a cross-replica update from a replica context where the strategy can.
    ("tensorflow", "__internal__.distribute.interim.maybe_merge_call"),
    # Overridden by the layers and the optimizer: what a checkpoint saves.
    ("keras.layers", "Layer._trackable_children"),
    ("keras.optimizers", "Optimizer._trackable_children"),
)


def _lookup_path(module: str, path: str) -> Any:
    value = _lookup(module, path.split(".")[0])
    for name in path.split(".")[1:]:
        if value is _MISSING:
            break
        value = getattr(value, name, _MISSING)
    return value


@functools.cache
def missing_framework_members() -> tuple[str, ...]:
    """``module.path`` for each of ``FRAMEWORK_MEMBERS`` the installed
    Keras or TensorFlow lacks."""
    return tuple(
        f"{module}.{path}"
        for module, path in FRAMEWORK_MEMBERS
        if _lookup_path(module, path) is _MISSING
    )


#: The same error under the name the layers' check uses: one class, so a
#: release that lacks members of both lists fails with one error naming all.
IncompatibleFrameworkError = IncompatibleKerasError


def check_framework() -> None:
    """Checks every private Keras and TensorFlow member outside the
    optimizer's pipeline (the layers' check; the optimizer's,
    :func:`check_keras_internals`, includes these).

    Raises:
      IncompatibleKerasError: naming every missing member and the versions.
    """
    raise_if_missing(list(missing_framework_members()))


def check_keras_internals(inner: Any) -> None:
    """Checks every listed member that exists before ``build``.

    ``inner`` is the optimizer being wrapped; its own attributes are checked
    when it is a Keras optimizer (anything else is left to the caller's
    type check).

    Raises:
      IncompatibleKerasError: naming every missing member and the Keras version.
    """
    missing = [
        f"{module}.{name}" for module, name in MODULE_FUNCTIONS if _lookup(module, name) is _MISSING
    ]
    base = keras.optimizers.Optimizer
    missing += missing_members("keras.optimizers.Optimizer", base, OPTIMIZER_METHODS)
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        missing += missing_members(
            "keras.optimizers.LossScaleOptimizer", inner, LOSS_SCALE_ATTRIBUTES
        )
        inner = getattr(inner, "inner_optimizer", None)
    if isinstance(inner, base):
        missing += missing_members(type(inner).__name__, inner, OPTIMIZER_ATTRIBUTES)
    raise_if_missing(missing + list(missing_framework_members()))


def check_built(inner: Any) -> None:
    """Checks, once ``inner`` (the wrapped optimizer) is built, the members
    its ``build`` creates: the slot lists the rules read.

    Raises:
      IncompatibleKerasError: naming every missing member and the Keras version.
    """
    missing = []
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        missing += missing_members(
            "keras.optimizers.LossScaleOptimizer", inner, LOSS_SCALE_BUILT_ATTRIBUTES
        )
        inner = inner.inner_optimizer
    needed = [
        attribute
        for attribute, option in slot_lists_of(type(inner)).values()
        if option is None or getattr(inner, option, False)
    ]
    missing += missing_members(type(inner).__name__, inner, needed)
    raise_if_missing(missing)


# -- the members, reached only through these ---------------------------------------

_Method = TypeVar("_Method", bound=Callable[..., Any])


def no_automatic_dependency_tracking(method: _Method) -> _Method:
    """Keras' decorator for ``build``; no decorator where Keras lacks it (the
    check then fails at construction)."""
    decorator = _lookup(*_TRACKING_DECORATOR)
    return method if decorator is _MISSING else decorator(method)


def var_key(optimizer: Any, variable: Any) -> Any:
    """The key under which ``optimizer`` knows ``variable`` (the same for
    every copy of a distributed variable)."""
    return optimizer._var_key(variable)


def trainable_variables(optimizer: Any) -> list[Any]:
    """The variables ``optimizer`` was built with."""
    return optimizer._trainable_variables


def check_variables_are_known(optimizer: Any, variables: list[Any]) -> None:
    optimizer._check_variables_are_known(variables)


def overwrites_with_gradient(optimizer: Any, variable: Any) -> bool:
    """Whether ``variable`` takes its gradient as its new value (no update rule)."""
    return bool(optimizer._overwrite_variable_with_gradient(variable))


def filter_empty_gradients(
    optimizer: Any, grads: list[Any], variables: list[Any]
) -> tuple[list[Any], list[Any]]:
    return optimizer._filter_empty_gradients(grads, variables)


def overwrite_variables_directly_with_gradients(
    optimizer: Any, grads: list[Any], variables: list[Any]
) -> tuple[list[Any], list[Any]]:
    """Assigns gradients to the variables that take them as values; returns the rest."""
    return optimizer._overwrite_variables_directly_with_gradients(grads, variables)


def clip_gradients(optimizer: Any, grads: list[Any]) -> list[Any]:
    """``optimizer``'s ``clipnorm`` / ``clipvalue`` / ``global_clipnorm``."""
    return optimizer._clip_gradients(grads)


def uses_weight_decay(optimizer: Any, variable: Any) -> bool:
    """Whether ``variable`` is not excluded from ``optimizer``'s weight decay."""
    return bool(optimizer._use_weight_decay(variable))


def apply_weight_decay(optimizer: Any, variables: list[Any]) -> None:
    optimizer._apply_weight_decay(variables)


def backend_update_step(
    optimizer: Any, grads: list[Any], variables: list[Any], learning_rate: Any
) -> None:
    """``optimizer``'s update rule on whole variables, across replicas."""
    optimizer._backend_update_step(grads, variables, learning_rate)


def slot(optimizer: Any, name: str, variable: Any) -> Any:
    """The slot variable ``name`` (a key of ``SLOT_LISTS``) of ``variable``."""
    attribute, _ = slot_lists_of(type(optimizer))[name]
    return getattr(optimizer, attribute)[optimizer._get_variable_index(variable)]


# -- members outside the optimizer's pipeline -----------------------------------------


def in_stateless_scope() -> bool:
    """True inside Keras' stateless scope (``model.stateless_call``)."""
    function = _lookup("keras.src.backend", "in_stateless_scope")
    return False if function is _MISSING else bool(function())


def in_save_context() -> bool:
    """True while ``tf.saved_model.save`` (or Keras' ``export``) traces functions."""
    function = _lookup("tensorflow.python.saved_model.save_context", "in_save_context")
    return False if function is _MISSING else bool(function())


def graph_in_xla_context(graph: Any) -> bool:
    """True while ``graph`` (or a graph it is nested in) is built for XLA."""
    function = _lookup("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext")
    return False if function is _MISSING else bool(function(graph))


def sharded_components(variable: Any) -> tuple:
    """The shards (or per-device copies) of a distributed variable."""
    return tuple(getattr(variable, "values", None) or variable._values)


def wrap_trackable_list(values: list[Any]) -> Any:
    """A list of trackables as TensorFlow's checkpointing saves one."""
    return tf.__internal__.tracking.wrap(values)


def maybe_merge_call(function: Callable[..., Any], strategy: Any, *args: Any) -> Any:
    """``function(strategy, *args)`` in cross-replica context, merged where
    the strategy can (TensorFlow's own helper for optimizers)."""
    return tf.__internal__.distribute.interim.maybe_merge_call(function, strategy, *args)


def h5_entry_path(store: Any) -> Any:
    """The path of the entry a Keras H5 store reads now, or None."""
    return getattr(store, "_h5_entry_path", None)


def h5_has_path(store: Any, path: str) -> bool:
    """Whether a Keras H5 weights store holds an entry at ``path``: its
    ``has_path`` (Keras 3.14 on), else a look into its ``h5_file`` (3.13)."""
    if hasattr(store, "has_path"):
        return bool(store.has_path(path))
    h5_file = getattr(store, "h5_file", None)
    return h5_file is not None and path in h5_file


def keep_error_as_raised(error: BaseException) -> None:
    """Has Keras re-raise ``error`` unchanged from a layer's call (Keras
    rebuilds errors to add call information, with a constructor our op
    errors lack)."""
    error._keras_call_info_injected = True  # type: ignore[attr-defined]


def sharded_variable(ref: Any) -> Any | None:
    """The ``ShardedVariable`` behind ``ref`` (ParameterServerStrategy with a
    ``variable_partitioner``), or None.

    TensorFlow exports no predicate for one: it is recognised by its shards
    and its private row offsets, behind a Keras variable's private ``_value``.
    """
    candidate = getattr(ref, "_value", ref)
    variables = getattr(candidate, "variables", None)
    if (
        not isinstance(candidate, tf.Variable)
        and isinstance(variables, (list, tuple))
        and variables
        and all(isinstance(v, tf.Variable) for v in variables)
        and hasattr(candidate, "_var_offsets")
    ):
        return candidate
    return None


# owner -> {child name: (ids of the list's items, the list saved in its place)}:
# a checkpoint asks for an object's children more than once and must get the
# same list object each time.
_SAVEABLE_LISTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def saveable_children(owner: Any, children: dict[str, Any]) -> dict[str, Any]:
    """``owner``'s checkpoint children, each Keras variable that holds a
    ``ShardedVariable`` (also in a list) replaced by that ``ShardedVariable``.

    Keras 3 cannot save such a variable (its save spec asks the
    ``ShardedVariable`` for a device); the ``ShardedVariable`` saves itself,
    shard by shard, under the same name.
    """

    def saved(child: Any) -> Any:
        return sharded_variable(child) or child

    result = {}
    for name, child in children.items():
        if isinstance(child, list) and any(saved(c) is not c for c in child):
            ids = tuple(id(c) for c in child)
            cached = _SAVEABLE_LISTS.setdefault(owner, {}).get(name)
            if cached is None or cached[0] != ids:
                cached = (ids, wrap_trackable_list([saved(c) for c in child]))
                _SAVEABLE_LISTS[owner][name] = cached
            result[name] = cached[1]
        else:
            result[name] = saved(child)
    return result


class SaveableChildren:
    """A mixin for a Keras layer, optimizer or module whose checkpoint
    children may hold sharded variables (``ParameterServerStrategy`` with a
    partitioner): they are saved as ShardedVariables, which Keras alone
    cannot save."""

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        children = super()._trackable_children(save_type, **kwargs)  # type: ignore[misc]
        return saveable_children(self, children)


def cluster_resolver_of(strategy: Any) -> Any:
    """The cluster resolver a ``ParameterServerStrategy`` was built with (its
    public ``cluster_resolver`` is None), or None."""
    return getattr(getattr(strategy, "extended", None), "_cluster_resolver", None)


# -- a Keras variable's tf.Variable and shape (growable rows) -------------------------

#: Attributes every Keras variable on the TensorFlow backend sets: the
#: tf.Variable it keeps and the shape it reports. A variable that lacks them
#: (another Keras release) is simply not made growable.
KERAS_VARIABLE_ATTRIBUTES: tuple[str, ...] = ("_value", "_shape")


def has_keras_variable_internals(variable: Any) -> bool:
    """Whether ``variable`` is a Keras variable whose tf.Variable and shape
    can be replaced (see ``_internal.growable``)."""
    return isinstance(variable, keras.Variable) and all(
        hasattr(variable, name) for name in KERAS_VARIABLE_ATTRIBUTES
    )


def keras_variable_backing(variable: Any) -> Any:
    """The tf.Variable a Keras variable keeps."""
    return variable._value


def set_keras_variable_backing(variable: Any, backing: tf.Variable) -> None:
    """Has a Keras variable keep ``backing`` (same dtype, same value)."""
    variable._value = backing


def set_keras_variable_shape(variable: Any, shape: tuple[int, ...]) -> None:
    """The shape a Keras variable reports (after its tf.Variable grew)."""
    variable._shape = tuple(int(size) for size in shape)
