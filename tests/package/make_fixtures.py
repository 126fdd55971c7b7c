"""Writes the compatibility fixtures: files saved by the code of main at
the commit that last wrote them (the one that removed the int32 checkpoint
stand-in, issue #43; 3f7d58d's files before it), kept so that later code is
checked to load them and give identical outputs.

Run with that code importable (``PYTHONPATH=<checkout>/python``); the files
it writes are committed under ``fixtures/``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import partial_embedding as pe  # noqa: E402

VOCABULARY, WIDTH, LENGTH = 40, 6, 5


def build_model() -> keras.Model:
    """Ids -> tied PartialReversibleEmbedding logits, plus a PartialEmbedding branch."""
    ids = keras.Input((LENGTH,), dtype="int32")
    tied = pe.PartialReversibleEmbedding(
        VOCABULARY, WIDTH, trainable_ids=range(30, 40), name="tied"
    )
    plain = pe.PartialEmbedding(VOCABULARY, WIDTH, frozen_ids=range(0, 20), name="plain")
    hidden = keras.layers.Add()([tied(ids), plain(ids)])
    logits = tied(hidden, reverse=True)
    return keras.Model(ids, logits)


def main(directory: str) -> None:
    keras.utils.set_random_seed(7)
    model = build_model()
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    rng = np.random.default_rng(7)
    ids = rng.integers(0, VOCABULARY, size=(8, LENGTH)).astype("int32")
    targets = rng.normal(size=(8, LENGTH, VOCABULARY)).astype("float32")
    model.fit(ids, targets, epochs=2, batch_size=4, verbose=0)
    os.makedirs(directory, exist_ok=True)
    model.save(os.path.join(directory, "model.keras"))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    checkpoint.write(os.path.join(directory, "checkpoint", "ckpt"))
    model.export(os.path.join(directory, "saved_model"), verbose=False)
    np.savez(
        os.path.join(directory, "expected.npz"),
        ids=ids,
        targets=targets,
        outputs=model.predict(ids, verbose=0),
        **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
        **{f"optimizer_{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)},
    )
    print("fixtures written with partial_embedding", pe.__version__, "from", pe.__file__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "fixtures"))
