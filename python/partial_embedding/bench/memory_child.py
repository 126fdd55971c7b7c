"""The memory benchmark's child process: builds and trains one case, announcing each phase."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from partial_embedding.bench.memory_figures import (
    END,
    TRANSIENT,
    MemoryCase,
)

__all__ = [
    "child_main",
]

# -- the child: one configuration ----------------------------------------------------


class _PhaseMarker:
    """The child's end of the pipes: announces a phase, waits for the answer."""

    def __init__(self, markers: int, acks: int) -> None:
        self.markers = markers
        self.acks = os.fdopen(acks, "rb")

    def __call__(self, phase: str) -> None:
        os.write(self.markers, f"phase {phase}\n".encode())
        self.acks.readline()

    def result(self, figures: dict[str, Any]) -> None:
        os.write(self.markers, f"result {json.dumps(figures)}\n".encode())


def _variables_bytes(variables: Sequence[Any]) -> int:
    import tensorflow as tf

    unique = {id(v): v for v in variables}
    # The current size (compact slots grow: their static row count is None),
    # without reading the values.
    return sum(int(tf.size(v)) * tf.as_dtype(v.dtype).size for v in unique.values())


def _training_data(case: MemoryCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([case.seed, 1])
    count = case.batch * (case.steps + 1)
    ids = rng.integers(0, case.vocab, (count, case.ids_per_sample), dtype=np.int32)
    return ids, rng.standard_normal((count, 1)).astype(np.float32)


def _permitted_rows(case: MemoryCase) -> np.ndarray:
    rng = np.random.default_rng([case.seed, 0])
    count = max(1, int(round(case.vocab * case.permitted_fraction)))
    return np.sort(rng.choice(case.vocab, size=count, replace=False))


def _run_keras_case(case: MemoryCase, mark: Callable[[str], None], weights_path: str | None) -> int:
    """Builds, compiles and fits the pooling model; returns its optimizer's bytes."""
    import keras

    from partial_embedding.bench.models import pooled_model
    from partial_embedding.layers import PartialEmbedding
    from partial_embedding.optimizers import MaskedOptimizer

    ids, targets = _training_data(case)
    permitted = _permitted_rows(case)
    mark("construction")
    optimizer: Any
    if case.variant == "keras":
        embedding: Any = keras.layers.Embedding(case.vocab, case.width)
        optimizer = keras.optimizers.Adam()
    else:
        weights = None if weights_path is None else np.load(weights_path, mmap_mode="r")
        embedding = PartialEmbedding(
            case.vocab, case.width, trainable_ids=permitted, weights=weights
        )
        optimizer = MaskedOptimizer(keras.optimizers.Adam())
    model = pooled_model(embedding, case.ids_per_sample)
    model.compile(optimizer=optimizer, loss="mse")
    mark("first_step")
    first = slice(0, case.batch)
    model.fit(ids[first], targets[first], batch_size=case.batch, epochs=1, verbose=0)
    mark("steady")
    rest = slice(case.batch, None)
    if case.steps:
        model.fit(
            ids[rest], targets[rest], batch_size=case.batch, epochs=1, shuffle=False, verbose=0
        )
    mark(END)
    # MaskedOptimizer's compact slots are not among `variables`.
    return _variables_bytes(
        [*optimizer.variables, *getattr(optimizer, "compact_slot_variables", [])]
    )


def _run_stock_tf_case(case: MemoryCase, mark: Callable[[str], None]) -> int:
    import tensorflow as tf

    from partial_embedding.bench.models import stock_tf_step

    ids, targets = _training_data(case)
    row_mask = np.zeros(case.vocab, dtype=bool)
    row_mask[_permitted_rows(case)] = True
    mark("construction")
    step, holders = stock_tf_step(case.vocab, case.width, row_mask, case.ids_per_sample)
    mark("first_step")
    for i in range(case.steps + 1):
        if i == 1:
            mark("steady")
        batch = slice(i * case.batch, (i + 1) * case.batch)
        step(tf.constant(ids[batch]), tf.constant(targets[batch])).numpy()
    if case.steps == 0:
        mark("steady")
    mark(END)
    # The lazy Adam's two moments, its step count, and the head's optimizer.
    first, second, _mask, step_count, _head, head_optimizer = holders[1:]
    return _variables_bytes([first, second, step_count, *head_optimizer.variables])


def _run_transient(case: MemoryCase, mark: Callable[[str], None]) -> int:
    mark("construction")
    # Three times, each freed at once: a sampler that a busy machine holds
    # back for a moment still gets a chance at one of them.
    for _ in range(3):
        table = np.ones((case.vocab, case.width), dtype=np.float32)
        del table
    mark("first_step")
    mark("steady")
    mark(END)
    return 0


def _warm_up(case: MemoryCase) -> None:
    """The same variant at 64 rows, two steps: loads what TF and Keras load
    lazily, so the baseline already holds it."""
    import gc

    import keras

    tiny = dataclasses.replace(case, vocab=64, batch=4, steps=1)
    if case.variant == "stock_tf":
        _run_stock_tf_case(tiny, lambda phase: None)
    elif case.variant != TRANSIENT:
        _run_keras_case(dataclasses.replace(tiny, variant="partial"), lambda phase: None, None)
        _run_keras_case(dataclasses.replace(tiny, variant="keras"), lambda phase: None, None)
    keras.backend.clear_session()
    gc.collect()


def child_main(spec_json: str, markers: int, acks: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import partial_embedding  # noqa: F401

    spec = json.loads(spec_json)
    weights_path = spec.pop("weights_path", None)
    case = MemoryCase(**spec)
    mark = _PhaseMarker(markers, acks)
    _warm_up(case)
    if case.variant == TRANSIENT:
        optimizer_bytes = _run_transient(case, mark)
    elif case.variant == "stock_tf":
        optimizer_bytes = _run_stock_tf_case(case, mark)
    else:
        optimizer_bytes = _run_keras_case(case, mark, weights_path)
    mark.result({"optimizer_bytes": optimizer_bytes})
