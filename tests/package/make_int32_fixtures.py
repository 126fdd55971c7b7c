"""Writes the int32-bookkeeping fixtures: files saved by the code of main at
5856fa8, whose int8 store maps (``float_row_ids``, ``float_row_index``) and
compact slots' row count were int32 variables (int64 since, so that they stay
on a GPU). Later code is checked to load them with identical outputs
(``test_saved_files.py``).

Run once with that code importable (``PYTHONPATH=<old checkout>/python``),
with this folder as the argument; the files it writes are committed under
``fixtures/int32_bookkeeping/``. Run it under the oldest Keras line CI tests
(3.13, ``_version.TESTED_KERAS_LINES``): a ``.keras`` file records every
initializer argument of the Keras that wrote it (3.15 adds ``input_axes`` to
``GlorotUniform``), and older lines refuse arguments they do not know.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import partial_embedding as pe  # noqa: E402

ROWS, WIDTH, LENGTH = 50, 8, 4
TRAINABLE, UNFROZEN = [3, 7, 9], [11]


def build_model(table: np.ndarray) -> tuple[keras.Model, keras.layers.Layer]:
    """An int8 PartialEmbedding (a row unfrozen after quantization) + a dense
    head, compiled with MaskedOptimizer(Adam) on compact slots."""
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=table, trainable_ids=TRAINABLE)
    ids = keras.Input((LENGTH,), dtype="int32")
    model = keras.Model(ids, keras.layers.Dense(2)(layer(ids)))
    layer.quantize("int8")
    layer.unfreeze(UNFROZEN)
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse", jit_compile=False)
    return model, layer


def inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5856)
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    ids = rng.integers(0, ROWS, size=(8, LENGTH)).astype(np.int32)
    ids[:, 0] = [3, 7, 9, 11, 3, 7, 9, 11]
    targets = rng.normal(size=(8, LENGTH, 2)).astype(np.float32)
    return table, ids, targets


def main(directory: str) -> None:
    keras.utils.set_random_seed(7)
    table, ids, targets = inputs()
    model, layer = build_model(table)
    model.fit(ids, targets, batch_size=4, epochs=2, verbose=0, shuffle=False)
    out = os.path.join(directory, "fixtures", "int32_bookkeeping")
    os.makedirs(out, exist_ok=True)
    assert layer.float_row_ids.dtype == "int32"  # the code these fixtures stand for
    model.save(os.path.join(out, "model.keras"))
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(os.path.join(out, "ckpt"))
    np.savez(
        os.path.join(out, "expected.npz"),
        outputs=model.predict(ids, verbose=0),
        **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
    )


if __name__ == "__main__":
    main(sys.argv[1])
