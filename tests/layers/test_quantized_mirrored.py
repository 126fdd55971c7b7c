"""A quantized PartialEmbedding under MirroredStrategy on two logical CPU devices.

Run as a script in its own process (logical devices must be set before
TensorFlow starts); it prints one JSON line that the test checks: every
replica's copy of every variable equals a single-device run on the same
batches, and the int8 rows and scales are those quantized at construction.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pe_testing import make_rng, run_script_report, seed_environment

ROWS, WIDTH, LENGTH, BATCH = 50, 8, 6, 8


def _fit(strategy, table: np.ndarray, ids: np.ndarray, targets: np.ndarray):
    import keras

    import partial_embedding as pe

    with strategy.scope():
        layer = pe.PartialEmbedding(
            ROWS, WIDTH, weights=table, trainable_ids=[3, 7, 45], dtype="int8_from_float32"
        )
        model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), layer])
        model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse")
    quantized = layer._embeddings.numpy().copy(), layer.embeddings_scale.numpy().copy()
    model.fit(ids, targets, epochs=3, batch_size=BATCH, shuffle=False, verbose=0)
    layer.unfreeze([10])
    model.fit(ids, targets, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    return layer, quantized


def _copies(variable) -> list[np.ndarray]:
    value = variable.value
    return [np.asarray(part.numpy()) for part in getattr(value, "values", [value])]


def _main() -> None:
    import tensorflow as tf

    import partial_embedding as pe

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = make_rng("test_quantized_mirrored")
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    ids = rng.integers(0, ROWS, size=(BATCH, LENGTH))
    # Every permitted row (10 after the unfreeze) looked up, on both replicas'
    # halves of the batch: otherwise some seeds train nothing (batches with no
    # permitted id are test_mirrored_frozen_batches' subject).
    ids[[0, BATCH // 2, 1, BATCH - 1], [0, 0, 1, 2]] = [3, 7, 45, 10]
    targets = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype(np.float32)
    single, _ = _fit(tf.distribute.get_strategy(), table, ids, targets)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored, quantized = _fit(strategy, table, ids, targets)
    report = {"replicas": strategy.num_replicas_in_sync, "mismatches": [], "frozen_moved": False}
    for name in (
        "_embeddings",
        "embeddings_scale",
        "float_rows",
        "float_rows_mask",
        "float_row_ids",
    ):
        expected = getattr(single, name).numpy()
        for copy in _copies(getattr(mirrored, name)):
            if not np.allclose(copy.astype(np.float64), expected.astype(np.float64), 1e-5, 1e-6):
                report["mismatches"].append(name)
    report["frozen_moved"] = not (
        np.array_equal(mirrored._embeddings.numpy(), quantized[0])
        and np.array_equal(mirrored.embeddings_scale.numpy(), quantized[1])
    )
    report["trained"] = not np.array_equal(mirrored.float_rows.numpy()[:3], table[[3, 7, 45]])
    # A strategy's store cannot grow: more new rows than free store rows is
    # a clear error, and nothing changes.
    state = [np.asarray(variable.numpy()).copy() for variable in mirrored.weights]
    try:
        mirrored.unfreeze(np.arange(11, 45))
        report["growth_refused"] = ""
    except pe.PartialEmbeddingArgumentError as error:
        report["growth_refused"] = str(error)
    report["unchanged_after_refusal"] = all(
        np.array_equal(np.asarray(variable.numpy()), kept)
        for variable, kept in zip(mirrored.weights, state)
    )
    print(json.dumps(report))


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device() -> None:
    report = run_script_report(os.path.abspath(__file__), seed_environment())
    assert report["replicas"] == 2
    assert report["mismatches"] == []
    assert not report["frozen_moved"]
    assert report["trained"]
    assert "cannot grow here" in report["growth_refused"]
    assert "trainable_capacity=19" in report["growth_refused"]
    assert report["unchanged_after_refusal"]


if __name__ == "__main__":
    sys.exit(_main())
