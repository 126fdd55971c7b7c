"""PartialEmbedding(combiner=...) under MirroredStrategy on two logical CPUs.

Run as a script in its own process (logical devices must be set before
TensorFlow starts); it prints one JSON line that the test checks: Keras' fit
of padded bags (one replica's half of a batch all padding, so its gradient
holds no row) gives every replica's copy of the table the single-device
result, frozen rows bit for bit.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pe_testing import make_rng, run_script_report, seed_environment

ROWS, WIDTH, LENGTH, BATCH = 40, 6, 5, 8


def _fit(strategy, table, trainable, ids, targets):
    import keras

    import partial_embedding as pe

    with strategy.scope():
        layer = pe.PartialEmbedding(
            ROWS, WIDTH, weights=table, trainable_ids=trainable, mask_zero=True, combiner="mean"
        )
        model = keras.Sequential(
            [
                keras.Input((LENGTH,), dtype="int32"),
                layer,
                keras.layers.Dense(1, kernel_initializer="ones"),
            ]
        )
        model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse")
    model.fit(ids, targets, epochs=3, batch_size=BATCH, shuffle=False, verbose=0)
    return layer


def _main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    rng = make_rng("test_embedding_bags_mirrored")
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    trainable = rng.random(ROWS) < 0.5
    trainable[0] = False  # The padding id.
    ids = rng.integers(1, ROWS, size=(2 * BATCH, LENGTH))
    ids[rng.random(ids.shape) < 0.3] = 0
    ids[BATCH + BATCH // 2 :] = 0  # The second replica's half of batch 2: no id.
    targets = rng.normal(size=(2 * BATCH, 1)).astype(np.float32)
    single = _fit(tf.distribute.get_strategy(), table, trainable, ids, targets)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored = _fit(strategy, table, trainable, ids, targets)
    expected = single.embeddings.numpy()
    copies = [np.asarray(part.numpy()) for part in mirrored.embeddings.value.values]
    report = {
        "replicas": strategy.num_replicas_in_sync,
        "copies": len(copies),
        "equal_to_single": all(np.allclose(c, expected, 1e-5, 1e-6) for c in copies),
        "frozen_bit_exact": all(
            np.array_equal(c[~trainable].view(np.uint32), table[~trainable].view(np.uint32))
            for c in copies
        ),
        "trained": bool((expected[trainable] != table[trainable]).any()),
    }
    print(json.dumps(report))


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device() -> None:
    report = run_script_report(os.path.abspath(__file__), seed_environment())
    assert report["replicas"] == 2 and report["copies"] == 2
    assert report["equal_to_single"]
    assert report["frozen_bit_exact"]
    assert report["trained"]


if __name__ == "__main__":
    sys.exit(_main())
