"""Batches with no permitted id under MirroredStrategy on two logical CPU devices.

Such a batch gives every replica an empty sparse gradient, and TensorFlow's
collective gather (which sums sparse gradients over replicas) crashed the
process on it (a segmentation fault). Each layer kind and optimizer here
trains on batches with permitted ids on both replicas, on neither, and on one;
the test checks that the process ends, that every copy of every variable
equals a single-device run on the same batches, and that frozen rows keep
their bits.

Run as a script in its own process (logical devices must be set before
TensorFlow starts); it prints one JSON line that the test checks.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pe_testing import (
    CPU_ONLY_ENVIRONMENT,
    bits_equal,
    make_rng,
    run_script_report,
    seed_environment,
)

ROWS, WIDTH, LENGTH = 30, 4, 3
PERMITTED = [2, 11, 17, 25]
KINDS = ["float", "int8", "reversible", "all_frozen"]
#: The stock optimizer is momentum SGD, linear in the gradient. Keras' stock
#: Adam squares the pieces of a sparse gradient before duplicates are summed
#: (``ops.square`` is elementwise on ``IndexedSlices``), so its second moment
#: depends on how the gradient is split: over replicas it differs from one
#: device wherever a row's gradient comes in more pieces there (our reverse
#: projection's: one per replica, against one on a single device).
OPTIMIZERS = ["masked_adam", "stock_sgd_momentum"]


def _batches(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Three global batches of four samples (two per replica): permitted ids
    on both replicas, on neither, then on the first replica only."""
    frozen = np.setdiff1d(np.arange(ROWS), PERMITTED)
    ids = rng.choice(frozen, size=(12, LENGTH))
    ids[[0, 2], 0] = rng.choice(PERMITTED, size=2)  # step 1: both halves
    ids[8, 1] = rng.choice(PERMITTED)  # step 3: the first half only
    targets = rng.normal(size=(12, ROWS)).astype(np.float32)
    return ids.astype(np.int32), targets


def _fit(strategy, kind: str, optimizer: str, table: np.ndarray, data: tuple):
    import keras

    import partial_embedding as pe

    trainable = [] if kind == "all_frozen" else PERMITTED
    with strategy.scope():
        if kind in ("float", "int8"):
            dtype = "int8_from_float32" if kind == "int8" else None
            layer = pe.PartialEmbedding(
                ROWS, WIDTH, weights=table, trainable_ids=trainable, dtype=dtype
            )
        else:
            layer = pe.PartialReversibleEmbedding(
                ROWS, WIDTH, weights=table, trainable_ids=trainable
            )
        ids = keras.Input((LENGTH,), dtype="int32")
        hidden = keras.layers.GlobalAveragePooling1D()(layer(ids))
        if kind in ("float", "int8"):
            outputs = keras.layers.Dense(ROWS, kernel_initializer="ones")(hidden)
        else:
            outputs = layer(hidden, reverse=True)
        model = keras.Model(ids, outputs)
        if optimizer == "masked_adam":
            model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), "mse")
        else:
            model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    model.fit(*data, epochs=1, batch_size=4, shuffle=False, verbose=0)
    return layer


def _copies(variable) -> list[np.ndarray]:
    value = variable.value
    return [np.asarray(part.numpy()) for part in getattr(value, "values", [value])]


def _frozen_state(layer, table: np.ndarray, frozen: np.ndarray) -> list[tuple]:
    """(what, now, then) for every frozen value the layer holds."""
    if getattr(layer, "quantization_mode", None) == "int8":
        return []  # the int8 rows are compared against the single-device run
    return [("frozen rows", layer.embeddings.numpy()[frozen], table[frozen])]


def _case(strategy, kind: str, optimizer: str, table: np.ndarray, data: tuple) -> dict:
    import tensorflow as tf

    single = _fit(tf.distribute.get_strategy(), kind, optimizer, table, data)
    mirrored = _fit(strategy, kind, optimizer, table, data)
    frozen = np.setdiff1d(np.arange(ROWS), [] if kind == "all_frozen" else PERMITTED)
    mismatches, frozen_moved = [], []
    for expected, variable in zip(single.weights, mirrored.weights, strict=True):
        for copy in _copies(variable):
            if copy.dtype.kind in "iub" and not bits_equal(copy, expected.numpy()):
                mismatches.append(variable.path)
            elif not np.allclose(copy.astype(np.float64), expected.numpy().astype(np.float64),
                                 rtol=1e-5, atol=1e-6):  # fmt: skip
                mismatches.append(variable.path)
    for what, now, then in _frozen_state(mirrored, table, frozen):
        if not bits_equal(now, then):
            frozen_moved.append(what)
    return {"mismatches": mismatches, "frozen_moved": frozen_moved}


def _main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = make_rng("test_mirrored_frozen_batches")
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    data = _batches(rng)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"replicas": strategy.num_replicas_in_sync}
    for kind in KINDS:
        for optimizer in OPTIMIZERS:
            report[f"{kind}/{optimizer}"] = _case(strategy, kind, optimizer, table, data)
    print(json.dumps(report))


@pytest.mark.slow
def test_batches_without_permitted_ids_train_like_one_device() -> None:
    # Two logical CPUs against one CPU, where a GPU is seen too.
    report = run_script_report(
        os.path.abspath(__file__), {**seed_environment(), **CPU_ONLY_ENVIRONMENT}
    )
    assert report.pop("replicas") == 2
    assert sorted(report) == sorted(f"{k}/{o}" for k in KINDS for o in OPTIMIZERS)
    for case, result in report.items():
        assert result["mismatches"] == [], case
        assert result["frozen_moved"] == [], case


if __name__ == "__main__":
    sys.exit(_main())
