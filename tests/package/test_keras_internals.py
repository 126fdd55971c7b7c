"""Tests of partial_embedding._internal.framework_private.

Every private Keras member MaskedOptimizer relies on is listed there: each must
exist on the installed Keras, a missing one must stop MaskedOptimizer at
construction (or build) with one message naming it, and no other module of the
package may reach a Keras private member by itself.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import keras
import numpy as np
import pytest

import partial_embedding as pe
from partial_embedding._internal import framework_private
from partial_embedding.optimizers import _row_rules as row_rules
from pe_testing import defined_names

IncompatibleKerasError = framework_private.IncompatibleKerasError

# Options under which each supported optimizer's build creates every slot list.
ALL_SLOTS_OPTIONS = {
    keras.optimizers.SGD: dict(momentum=0.5),
    keras.optimizers.Adam: dict(amsgrad=True),
    keras.optimizers.AdamW: dict(amsgrad=True),
    keras.optimizers.Adagrad: {},
    keras.optimizers.RMSprop: dict(momentum=0.5, centered=True),
    pe.RowwiseAdagrad: {},
    pe.RowwiseAdam: {},
    keras.optimizers.Ftrl: {},
}

#: Slots that hold one value per row (the row-wise rules' second moments).
PER_ROW_SLOTS = {(pe.RowwiseAdagrad, "accumulator"), (pe.RowwiseAdam, "velocity")}


def _table() -> keras.Variable:
    return keras.Variable(np.ones((4, 2), np.float32))


# --- every listed member exists on the installed Keras ----------------------------


@pytest.mark.parametrize("module, name", framework_private.MODULE_FUNCTIONS)
def test_listed_function_exists(module, name):
    assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize("name", framework_private.OPTIMIZER_METHODS)
def test_listed_optimizer_method_exists(name):
    assert callable(getattr(keras.optimizers.Optimizer, name))


@pytest.mark.parametrize(
    "optimizer_class", row_rules.SUPPORTED_OPTIMIZERS, ids=lambda c: c.__name__
)
def test_listed_optimizer_attributes_and_slot_lists_exist(optimizer_class):
    assert set(ALL_SLOTS_OPTIONS) == set(row_rules.SUPPORTED_OPTIMIZERS)
    optimizer = optimizer_class(**ALL_SLOTS_OPTIONS[optimizer_class])
    for name in framework_private.OPTIMIZER_ATTRIBUTES:
        assert hasattr(optimizer, name), name
    table = _table()
    optimizer.build([table])
    slot_lists = framework_private.slot_lists_of(optimizer_class)
    assert slot_lists, f"no SLOT_LISTS entry for {optimizer_class.__name__}"
    for slot_name, (attribute, _) in slot_lists.items():
        assert hasattr(optimizer, attribute), attribute
        slot = framework_private.slot(optimizer, slot_name, table)
        assert isinstance(slot, keras.Variable), slot_name
        shape = table.shape[:1] if (optimizer_class, slot_name) in PER_ROW_SLOTS else table.shape
        assert (tuple(slot.shape), slot.dtype) == (tuple(shape), table.dtype), slot_name


def test_listed_loss_scale_attributes_exist():
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    for name in framework_private.LOSS_SCALE_ATTRIBUTES:
        assert hasattr(optimizer, name), name
    optimizer.build([_table()])
    for name in framework_private.LOSS_SCALE_BUILT_ATTRIBUTES:
        assert isinstance(getattr(optimizer, name), keras.Variable), name


def test_checks_pass_on_the_installed_keras():
    for inner in (
        keras.optimizers.RMSprop(momentum=0.5, centered=True),
        keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(amsgrad=True)),
    ):
        framework_private.check_keras_internals(inner)
        inner.build([_table()])
        framework_private.check_built(inner)


# --- a missing member: one clear error, before any step ---------------------------


def _assert_names(error: pytest.ExceptionInfo, *names: str) -> None:
    message = str(error.value)
    assert isinstance(error.value, ImportError)
    assert f"installed Keras {keras.version()}" in message, message
    for name in names:
        assert name in message, message


def test_missing_members_of_a_stand_in():
    class StandIn:
        present = None

    missing = framework_private.missing_members("StandIn", StandIn(), ["present", "_gone", "_also"])
    assert missing == ["StandIn._gone", "StandIn._also"]
    with pytest.raises(IncompatibleKerasError) as error:
        framework_private.raise_if_missing(missing)
    _assert_names(error, "StandIn._gone, StandIn._also")
    framework_private.raise_if_missing([])


def test_missing_members_fail_construction_naming_every_one(monkeypatch):
    monkeypatch.setattr(
        framework_private,
        "OPTIMIZER_METHODS",
        (*framework_private.OPTIMIZER_METHODS, "_gone_in_this_release"),
    )
    monkeypatch.setattr(
        framework_private,
        "MODULE_FUNCTIONS",
        (*framework_private.MODULE_FUNCTIONS, ("keras.src.no_such_module", "helper")),
    )
    monkeypatch.setattr(
        framework_private, "LOSS_SCALE_ATTRIBUTES", ("inner_optimizer", "_gone_scale")
    )
    with pytest.raises(IncompatibleKerasError) as error:
        pe.MaskedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    _assert_names(
        error,
        "keras.optimizers.Optimizer._gone_in_this_release",
        "keras.src.no_such_module.helper",
        "keras.optimizers.LossScaleOptimizer._gone_scale",
    )


def test_missing_slot_list_fails_build_naming_it(monkeypatch):
    table = _table()
    monkeypatch.setitem(
        framework_private.SLOT_LISTS, keras.optimizers.Adam, {"momentum": ("_gone_momentums", None)}
    )
    optimizer = pe.MaskedOptimizer(keras.optimizers.AdamW(), row_masks=[(table, np.ones(4, bool))])
    with pytest.raises(IncompatibleKerasError) as error:
        optimizer.build([table])
    _assert_names(error, "AdamW._gone_momentums")


def test_slot_list_of_an_unset_option_is_not_required():
    optimizer = keras.optimizers.Adam(amsgrad=False)
    optimizer.build([_table()])
    assert not hasattr(optimizer, "_velocity_hats")
    framework_private.check_built(optimizer)


# --- nothing else reaches a Keras private member -----------------------------------

PACKAGE = Path(framework_private.__file__).parent


def test_only_framework_private_reaches_private_keras_members():
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.glob("*.py"))}
    trees = {path: ast.parse(source) for path, source in sources.items()}
    ours = set().union(*(defined_names(tree) for tree in trees.values()))
    for path, tree in trees.items():
        if path.name == "framework_private.py":
            continue
        reached = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        }
        assert reached <= ours, (
            f"{path.name} reaches {sorted(reached - ours)}: go through framework_private"
        )
        assert "keras.src" not in sources[path], f"{path.name} imports keras.src"


def test_missing_members_of_both_lists_fail_construction_in_one_error(monkeypatch):
    monkeypatch.setattr(
        framework_private,
        "OPTIMIZER_METHODS",
        (*framework_private.OPTIMIZER_METHODS, "_gone_in_this_release"),
    )
    monkeypatch.setattr(
        framework_private,
        "FRAMEWORK_MEMBERS",
        (*framework_private.FRAMEWORK_MEMBERS, ("keras.layers", "Layer._gone_too")),
    )
    framework_private.missing_framework_members.cache_clear()
    try:
        with pytest.raises(framework_private.IncompatibleFrameworkError) as error:
            pe.MaskedOptimizer(keras.optimizers.Adam())
        _assert_names(
            error,
            "keras.optimizers.Optimizer._gone_in_this_release",
            "keras.layers.Layer._gone_too",
        )
    finally:
        monkeypatch.undo()
        framework_private.missing_framework_members.cache_clear()
