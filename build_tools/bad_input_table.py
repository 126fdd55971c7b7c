"""Prints the bad-input table of docs/bad_input.md, generated from the tests' own cases.

    python build_tools/bad_input_table.py > bad_inputs.md

The cases are read from the test modules (the ``BAD_INPUTS`` table of
tests/ops/test_masked_scatter_sub.py, ``BAD_BAG_ARGUMENTS`` of
tests/ops/test_masked_embedding_lookup_sparse.py and the ``parametrize`` lists of the bad-input
tests of the op, the layer and the optimizer), run here once more, and each
row reports the error raised and whether the variable kept every bit. A case
that raises nothing or changes a variable is printed as such and makes the
script exit non-zero.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pe_testing, and the test modules whose parametrize lists the table reads.
for _folder in ("tests", "tests/ops", "tests/layers", "tests/optimizers"):
    sys.path.insert(0, os.path.join(ROOT, _folder))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import partial_embedding as pe  # noqa: E402

_failures: list[str] = []


def _parametrized(test: Callable[..., Any]) -> list[tuple]:
    """The argument tuples of a test's (first) parametrize mark."""
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize":
            names = mark.args[0]
            count = len(names.split(",")) if isinstance(names, str) else len(names)
            return [tuple(v) if count > 1 else (v,) for v in mark.args[1]]
    raise ValueError(f"{test.__name__} is not parametrized")


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 4:
            return f"{value.tolist()} ({value.dtype})"
        return f"{value.dtype.name} array of shape {list(value.shape)}"
    if isinstance(value, tf.Tensor):
        return f"{value.dtype.name} tensor of shape {value.shape.as_list()}"
    if isinstance(value, tf.Variable):
        return f"{value.dtype.name} variable of shape {value.shape.as_list()}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_describe(v)}" for k, v in value.items())
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_EXPLAINING = re.compile(r"is not in|must|expected|not supported|does not|cannot|found")


def _first_line(error: BaseException) -> str:
    """The line of the message that says what is wrong.

    TensorFlow wraps graph errors in a stack trace and Keras wraps layer
    errors in a call summary; the explaining line is inside.
    """
    message = getattr(error, "message", None) or str(error)
    message = re.sub(r"\x1b\[[0-9;]*m", "", message)  # Keras' terminal bold
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    explaining = [line for line in lines if _EXPLAINING.search(line) and "File " not in line]
    line = (explaining or lines or [""])[0]
    if "}} " in line:
        line = line.split("}} ", 1)[1]
    line = re.sub(r"\s*\[Op:[^\]]*\].*$", "", line)
    line = line.replace("|", "\\|")
    return line if len(line) <= 150 else line[:147] + "..."


def _row(unit: str, what: str, call: Callable[[], Any], state: Callable[[], str]) -> str:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the table reports whatever is raised
        error_text = f"`{type(error).__name__}`: {_first_line(error)}"
    else:
        error_text = "**no error**"
        _failures.append(f"{unit}: {what}")
    kept = state()
    if kept.startswith("**"):
        _failures.append(f"{unit}: {what}: {kept}")
    return f"| {unit} | {what} | {error_text} | {kept} |"


def _unchanged(variable: Any, before: np.ndarray) -> Callable[[], str]:
    def check() -> str:
        after = np.asarray(variable.numpy())
        same = after.tobytes() == before.tobytes()
        return "unchanged, bit for bit" if same else "**changed**"

    return check


def _no_variable() -> str:
    return "nothing created"


def scatter_sub_rows() -> list[str]:
    import test_masked_scatter_sub as tests

    from pe_testing import case_seed

    rng = np.random.default_rng(case_seed("bad_input_table"))
    mode_names = {"eager": "eager", "function_dynamic_shapes": "tf.function, unknown shapes"}
    rows = []
    for case in sorted(tests.BAD_INPUTS):
        indices, updates, mask, _ = tests.BAD_INPUTS[case]
        for mode in tests.BAD_INPUT_MODES:
            var, variable = tests._bad_input_variable(rng)
            call = tests._bad_input_call(mode, variable, indices, updates, mask)
            what = (
                f"{case} ({mode_names[mode]}): indices={_describe(indices)}, "
                f"updates {list(updates.shape)}, row_mask {list(mask.shape)} "
                "on a [10, 3] float32 table"
            )
            rows.append(_row("masked_scatter_sub", what, call, _unchanged(variable, var)))
    for case, args, _, _ in _parametrized(tests.test_bad_dtype_is_reported_and_nothing_written):
        var, variable = tests._bad_input_variable(rng)
        what = f"{case}: " + ", ".join(_describe(a) for a in args)
        rows.append(
            _row(
                "masked_scatter_sub",
                what,
                lambda args=args, variable=variable: pe.masked_scatter_sub(variable, *args),
                _unchanged(variable, var),
            )
        )
    for (not_a_variable,) in _parametrized(tests.test_non_variable_is_rejected):
        rows.append(
            _row(
                "masked_scatter_sub",
                f"ref = {type(not_a_variable).__name__}",
                lambda ref=not_a_variable: pe.masked_scatter_sub(
                    ref, [1], np.ones((1, 3), np.float32), tests.GOOD_MASK
                ),
                _no_variable,
            )
        )
    integer_variable = tf.Variable(np.arange(10, dtype=np.int32))
    rows.append(
        _row(
            "masked_scatter_sub",
            "int32 variable",
            lambda: pe.masked_scatter_sub(
                integer_variable, [1], np.ones(1, np.int32), tests.GOOD_MASK
            ),
            _unchanged(integer_variable, integer_variable.numpy().copy()),
        )
    )
    return rows


def lookup_rows() -> list[str]:
    variable = tf.Variable(tf.ones([4, 2]))
    before = variable.numpy().copy()
    mask = [True, False, True, True]
    cases = [
        ("params is a tensor", tf.ones([4, 2]), [0], mask),
        ("int32 params", tf.Variable(tf.ones([4, 2], tf.int32)), [0], mask),
        ("float ids", variable, [0.5], mask),
        ("row_mask of 2 entries", variable, [0], [True, False]),
        ("row_mask of rank 2", variable, [0], [[True] * 4]),
        ("int row_mask", variable, [0], [1, 0, 1, 1]),
        ("id = 4 (V = 4)", variable, [0, 4], mask),
        ("id = -1", variable, [-1], mask),
    ]
    return [
        _row(
            "masked_embedding_lookup",
            f"{what} (table [4, 2] float32)",
            lambda p=params, i=ids, m=row_mask: pe.masked_embedding_lookup(p, i, m),
            _unchanged(variable, before),
        )
        for what, params, ids, row_mask in cases
    ]


def bag_rows() -> list[str]:
    import test_masked_embedding_lookup_sparse as tests

    rows = []
    for case, kwargs, _, _ in tests.BAD_BAG_ARGUMENTS:
        variable = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))
        before = variable.numpy().copy()
        made = ", ".join(
            f"{name}={_describe(value() if callable(value) else value)}"
            for name, value in kwargs.items()
        )
        rows.append(
            _row(
                "masked_embedding_lookup_sparse",
                f"{case}: {made} (table [4, 2] float32, else ragged ids [[0, 1], [2]])",
                lambda v=variable, k=kwargs: tests.bad_bag_call(v, k),
                _unchanged(variable, before),
            )
        )
    return rows


def sharded_rows() -> list[str]:
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    rows = []
    for bad in (-1, 10):
        sharded = ShardedVariable([tf.Variable(table[:5]), tf.Variable(table[5:])])

        def state(sharded=sharded) -> str:
            after = np.concatenate([v.numpy() for v in sharded.variables])
            return "every shard unchanged" if after.tobytes() == table.tobytes() else "**changed**"

        rows.append(
            _row(
                "masked_scatter_sub (ShardedVariable)",
                f"indices=[0, 9, {bad}] on 2 shards of 5 rows",
                lambda s=sharded, b=bad: pe.masked_scatter_sub(
                    s, [0, 9, b], np.ones((3, 3), np.float32), np.ones(10, bool)
                ),
                state,
            )
        )
    return rows


def layer_rows() -> list[str]:
    import test_layers as tests

    rows = []
    for kwargs, _, _ in _parametrized(tests.test_bad_constructor_arguments):
        rows.append(
            _row(
                "PartialEmbedding",
                f"PartialEmbedding({tests.NUM_ROWS}, {tests.WIDTH}, {_describe(kwargs)})",
                lambda kwargs=kwargs: pe.PartialEmbedding(tests.NUM_ROWS, tests.WIDTH, **kwargs),
                _no_variable,
            )
        )
    for (bad,) in _parametrized(tests.test_bad_dimensions):
        rows.append(
            _row(
                "PartialEmbedding",
                f"input_dim = {bad!r}",
                lambda bad=bad: pe.PartialEmbedding(bad, tests.WIDTH),
                _no_variable,
            )
        )
    layer = pe.PartialEmbedding(tests.NUM_ROWS, tests.WIDTH, trainable_ids=[1, 2])
    layer.build()
    mask_before = layer.trainable_mask.numpy().copy()
    for ids in ([1, tests.NUM_ROWS + 2], [-5], [1.5], None):
        rows.append(
            _row(
                "PartialEmbedding",
                f"freeze({ids!r})",
                lambda ids=ids: layer.freeze(ids),
                _unchanged(layer.trainable_mask, mask_before),
            )
        )
    table_before = layer.embeddings.numpy().copy()
    rows.append(
        _row(
            "PartialEmbedding",
            f"call with id {tests.NUM_ROWS}",
            lambda: layer(np.array([[0, tests.NUM_ROWS]])),
            _unchanged(layer.embeddings, table_before),
        )
    )
    return rows


def admission_rows() -> list[str]:
    import keras
    import test_row_admission as tests

    rows = []
    for arguments, _ in _parametrized(tests.test_bad_arguments_are_named):
        rows.append(
            _row(
                "RowAdmission",
                f"RowAdmission({_describe(arguments)})",
                lambda arguments=arguments: pe.RowAdmission(**arguments),
                _no_variable,
            )
        )
    layer = pe.PartialEmbedding(6, 2, admission=pe.RowAdmission(min_count=1, capacity=3))
    layer(np.array([1]), training=True)
    before = [np.array(v.numpy()) for v in layer.weights]

    def unchanged_state() -> str:
        same = all(np.array_equal(v.numpy(), b) for v, b in zip(layer.weights, before))
        return "unchanged, bit for bit" if same else "CHANGED"

    rows.append(
        _row(
            "PartialEmbedding(admission=...)",
            "training call with id 6 on 6 rows",
            lambda: layer(np.array([2, 6, 3]), training=True),
            unchanged_state,
        )
    )
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(), compact_slots=True, slot_capacity=2)
    from pe_testing import sharding_creator

    with tf.variable_creator_scope(sharding_creator(8, (4, 4))):
        sharded = pe.PartialEmbedding(8, 2, admission=pe.RowAdmission(capacity=3))
        sharded.build()
    rows.append(
        _row(
            "MaskedOptimizer",
            "slot_capacity=2 for a sharded table whose admission has capacity=3",
            lambda: optimizer.build([sharded.embeddings]),
            _no_variable,
        )
    )
    return rows


def optimizer_rows() -> list[str]:
    import keras
    import test_optimizers as tests

    inner_optimizers = [
        (type(inner).__name__, inner)
        for inner in (
            make_inner()
            for (make_inner,) in _parametrized(
                tests.test_unsupported_inner_optimizer_is_rejected_naming_the_supported
            )
        )
    ]
    inner_optimizers += [
        ("Adam(use_ema=True)", keras.optimizers.Adam(use_ema=True)),
        (
            "Adam(gradient_accumulation_steps=2)",
            keras.optimizers.Adam(gradient_accumulation_steps=2),
        ),
    ]
    rows = [
        _row(
            "MaskedOptimizer",
            f"inner = {what}",
            lambda inner=inner: pe.MaskedOptimizer(inner),
            _no_variable,
        )
        for what, inner in inner_optimizers
    ]
    table = keras.Variable(np.ones((4, 2), np.float32))
    optimizer = pe.MaskedOptimizer(keras.optimizers.SGD(), row_masks=[(table, np.ones(3, bool))])
    rows.append(
        _row(
            "MaskedOptimizer",
            "row mask of 3 entries for a [4, 2] table",
            lambda: optimizer.build([table]),
            _unchanged(table, table.numpy().copy()),
        )
    )
    table = keras.Variable(np.ones((4, 2), np.float32))
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(0.1), row_masks=[(table, np.array([True, False, True, True]))]
    )
    bad_gradient = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 7]), tf.constant([4, 2]))
    rows.append(
        _row(
            "MaskedOptimizer",
            "Adam step with gradient row id 7 for a [4, 2] table",
            lambda: optimizer.apply([bad_gradient], [table]),
            _unchanged(table, table.numpy().copy()),
        )
    )
    return rows


def _xla_row(unit: str, what: str, call: Callable[[], Any], state: Callable[[], str]) -> str:
    """A run-time bad id under XLA, which cannot raise: the row reports what
    happened instead, and fails if anything but the permitted, valid rows
    changed."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the table reports whatever is raised
        error_text = f"**raised** `{type(error).__name__}`: {_first_line(error)}"
        _failures.append(f"{unit}: {what}: raised under XLA")
    else:
        error_text = "none (XLA cannot raise at run time)"
    kept = state()
    if kept.startswith("**"):
        _failures.append(f"{unit}: {what}: {kept}")
    return f"| {unit} | {what} | {error_text} | {kept} |"


def _only_rows_changed(variable: Any, before: np.ndarray, changed: list[int]) -> Callable[[], str]:
    """Checks that exactly rows ``changed`` moved and every other row kept its bits."""

    def check() -> str:
        after = np.asarray(variable.numpy())
        moved = [i for i in range(len(before)) if after[i].tobytes() != before[i].tobytes()]
        if moved != changed:
            return f"**rows {moved} changed, expected {changed}**"
        return f"bad id skipped; rows {changed} (valid, permitted) updated, all others bit for bit"

    return check


def xla_rows() -> list[str]:
    """Run-time bad ids under ``jit_compile=True``: skipped, never written."""
    rows = []
    mask = np.array([True, True, True, False] + [True] * 6)
    for ids in ([0, 11, 2], [1, 2, -1], [3, 10, 4]):
        table = tf.Variable(tf.reshape(tf.range(30, dtype=tf.float32), [10, 3]))
        before = table.numpy().copy()

        @tf.function(jit_compile=True)
        def update(ids: tf.Tensor, table: tf.Variable = table) -> None:
            pe.masked_scatter_sub(table, ids, tf.ones([3, 3]), mask)

        good = sorted({i for i in ids if 0 <= i < 10 and mask[i]})
        rows.append(
            _xla_row(
                "masked_scatter_sub under XLA",
                f"indices={ids} on a [10, 3] table, row 3 frozen",
                lambda update=update, ids=ids: update(tf.constant(ids)),
                _only_rows_changed(table, before, good),
            )
        )
    for bad in (4, -1):
        import keras

        table = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))
        row_mask = tf.Variable([True, False, True, True])
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=[(table, row_mask)])
        optimizer.build([table])
        before = table.numpy().copy()
        looked_up: list[np.ndarray] = []

        @tf.function(jit_compile=True)
        def step(
            ids: tf.Tensor, table: Any = table, row_mask: Any = row_mask, optimizer: Any = optimizer
        ) -> tf.Tensor:
            with tf.GradientTape() as tape:
                rows_ = pe.masked_embedding_lookup(table, ids, row_mask)
                loss = tf.reduce_sum(rows_)
            optimizer.apply([tape.gradient(loss, table)], [table])
            return rows_

        def call(step: Any = step, bad: int = bad, looked_up: Any = looked_up) -> None:
            looked_up.append(step(tf.constant([0, bad, 1])).numpy())

        def state(check: Callable[[], str], looked_up: list[np.ndarray]) -> str:
            text = check()
            if not looked_up or looked_up[0][1].any():
                return "**the bad id did not look up a row of zeros**"
            return text.replace("bad id skipped", "bad id looked up zeros, no gradient")

        rows.append(
            _xla_row(
                "masked_embedding_lookup + MaskedOptimizer(Adam) under XLA",
                f"ids=[0, {bad}, 1] on a [4, 2] table, row 1 frozen",
                call,
                functools.partial(state, _only_rows_changed(table, before, [0]), looked_up),
            )
        )
    return rows


def main() -> int:
    rows = [
        "| unit | input | error | variable state |",
        "| --- | --- | --- | --- |",
        *scatter_sub_rows(),
        *sharded_rows(),
        *lookup_rows(),
        *bag_rows(),
        *layer_rows(),
        *admission_rows(),
        *optimizer_rows(),
        *xla_rows(),
    ]
    print("\n".join(rows))
    if _failures:
        print("\nCases that did not raise or changed a variable:", file=sys.stderr)
        for failure in _failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
