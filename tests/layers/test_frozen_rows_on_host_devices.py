"""``frozen_rows_on="host"`` on two logical CPU devices, in a process of its own.

Logical devices must be set before TensorFlow starts, so this file runs
itself as a script and prints one JSON line that the tests check:

* placement: a layer built and trained under ``tf.device("/CPU:1")`` (the
  compute device here) keeps its frozen table on ``/CPU:0`` and its store,
  masks and the optimizer's slots on ``/CPU:1``; in the traced lookup every
  op that reads the frozen table runs on ``/CPU:0`` (only the gathered rows
  leave it), and training gives the plain layer's rows bit for bit;
* ``MirroredStrategy`` over both devices: every replica's copy of every
  variable equals a single-device run on the same batches.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pe_testing import make_rng, run_script_report, seed_environment

ROWS, WIDTH, LENGTH, BATCH = 50, 8, 6, 8
TRAINABLE = [3, 7, 45]


def _fit(strategy, table: np.ndarray, ids: np.ndarray, targets: np.ndarray, on: str):
    import keras

    import partial_embedding as pe

    with strategy.scope():
        layer = pe.PartialEmbedding(
            ROWS, WIDTH, weights=table, trainable_ids=TRAINABLE, frozen_rows_on=on
        )
        model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), layer])
        model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse")
    model.fit(ids, targets, epochs=3, batch_size=BATCH, shuffle=False, verbose=0)
    layer.unfreeze([10])
    model.fit(ids, targets, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    return layer


def _copies(variable) -> list[np.ndarray]:
    value = variable.value
    return [np.asarray(part.numpy()) for part in getattr(value, "values", [value])]


def _rows(layer) -> np.ndarray:
    return np.asarray(layer(np.arange(ROWS)[None, :]).numpy())[0]


def _device(variable) -> str:
    import keras

    return variable.value.device if isinstance(variable, keras.Variable) else variable.device


def _placement(table: np.ndarray, ids: np.ndarray, targets: np.ndarray) -> dict:
    import keras
    import tensorflow as tf

    import partial_embedding as pe

    report: dict = {}
    layers = {}
    with tf.device("/CPU:1"):
        for on in ("device", "host"):
            layer = pe.PartialEmbedding(
                ROWS, WIDTH, weights=table, trainable_ids=TRAINABLE, frozen_rows_on=on
            )
            optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
            for _ in range(3):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(layer(ids) - targets))
                grads = tape.gradient(loss, layer.trainable_variables)
                optimizer.apply(grads, layer.trainable_variables)
            layers[on] = (layer, optimizer)
    host, optimizer = layers["host"]
    report["devices"] = {
        variable.name: _device(variable)
        for variable in [*host.weights, *optimizer.compact_slot_variables]
    }
    report["same_as_plain"] = bool(np.array_equal(_rows(host), _rows(layers["device"][0])))
    report["frozen_kept"] = bool(np.array_equal(host.embeddings.numpy(), table))

    with tf.device("/CPU:1"):
        lookup = tf.function(lambda batch: host(batch)).get_concrete_function(
            tf.TensorSpec([None, LENGTH], tf.int32)
        )
    table_handle = host.embeddings.value.handle
    # The captured handle of the frozen table, and every op reading it.
    placeholders = [
        internal.op.name
        for external, internal in lookup.graph.captures
        if external is table_handle or getattr(external, "_id", None) == table_handle._id
    ]
    # A ReadVariableOp of the table runs where the variable is (TensorFlow
    # colocates it with the handle); what consumes the whole table must too.
    readers = [
        op
        for op in lookup.graph.get_operations()
        if any(i.op.name in placeholders for i in op.inputs)
    ]
    report["table_reads"] = sorted({op.type for op in readers})
    report["table_consumers"] = sorted(
        {
            (consumer.type, consumer.device)
            for reader in readers
            for output in reader.outputs
            for consumer in output.consumers()
        }
    )
    return report


def _main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = make_rng("test_frozen_rows_on_host_devices")
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    ids = rng.integers(0, ROWS, size=(BATCH, LENGTH))
    # Every permitted row (4 after the unfreeze) on both replicas' halves.
    ids[[0, BATCH // 2, 1, BATCH - 1], [0, 0, 1, 2]] = [3, 7, 45, 10]
    targets = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype(np.float32)
    report = _placement(table, ids, targets)

    single = _fit(tf.distribute.get_strategy(), table, ids, targets, "host")
    plain = _fit(tf.distribute.get_strategy(), table, ids, targets, "device")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored = _fit(strategy, table, ids, targets, "host")
    report["replicas"] = strategy.num_replicas_in_sync
    report["mismatches"] = []
    for variable, expected in zip(mirrored.weights, single.weights):
        for copy in _copies(variable):
            if not np.allclose(
                copy.astype(np.float64), expected.numpy().astype(np.float64), 1e-5, 1e-6
            ):
                report["mismatches"].append(variable.name)
    report["single_same_as_plain"] = bool(np.array_equal(_rows(single), plain.embeddings.numpy()))
    report["mirrored_frozen_kept"] = all(
        np.array_equal(copy, table) for copy in _copies(mirrored.embeddings)
    )
    report["trained"] = not np.allclose(_rows(mirrored)[[3, 7, 45, 10]], table[[3, 7, 45, 10]])
    print(json.dumps(report))


@pytest.fixture(scope="module")
def report() -> dict:
    return run_script_report(os.path.abspath(__file__), seed_environment())


@pytest.mark.slow
def test_frozen_table_on_the_host_store_on_the_compute_device(report: dict) -> None:
    devices = report["devices"]
    assert devices.pop("embeddings").endswith("device:CPU:0")
    assert devices  # the store, the mask and the optimizer's slots
    for name, device in devices.items():
        assert device.endswith("device:CPU:1"), (name, device)
    assert report["table_reads"] == ["ReadVariableOp"]
    assert report["table_consumers"] == [["GatherV2", "/device:CPU:0"]]
    assert report["same_as_plain"]
    assert report["frozen_kept"]


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device(report: dict) -> None:
    assert report["replicas"] == 2
    assert report["mismatches"] == []
    assert report["single_same_as_plain"]
    assert report["mirrored_frozen_kept"]
    assert report["trained"]


if __name__ == "__main__":
    sys.exit(_main())
