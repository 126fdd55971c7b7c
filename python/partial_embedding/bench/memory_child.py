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
    INT8_VARIANTS,
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


def _make_embedding(case: MemoryCase, permitted: np.ndarray, weights: Any) -> tuple[Any, Any]:
    """The case's embedding layer and its optimizer."""
    import keras

    from partial_embedding.layers import PartialEmbedding
    from partial_embedding.optimizers import MaskedOptimizer

    if case.variant == "keras":
        return keras.layers.Embedding(case.vocab, case.width), keras.optimizers.Adam()
    if case.variant in INT8_VARIANTS:
        from partial_embedding.bench.quantized import int8_embedding

        embedding = int8_embedding(case.variant, case.vocab, case.width, permitted, weights)
    else:
        embedding = PartialEmbedding(
            case.vocab, case.width, trainable_ids=permitted, weights=weights
        )
    return embedding, MaskedOptimizer(keras.optimizers.Adam())


def _run_keras_case(case: MemoryCase, mark: Callable[[str], None], weights: Any) -> dict[str, Any]:
    """Builds, compiles and fits the pooling model; returns the child's own
    figures: its optimizer's bytes, each variable's bytes, the allocators'
    figures and (int8) whether a sample of frozen rows kept its bytes."""
    from partial_embedding.bench.models import pooled_model
    from partial_embedding.bench.quantized import (
        FrozenSample,
        allocator_figures,
        variable_bytes,
    )

    ids, targets = _training_data(case)
    permitted = _permitted_rows(case)
    mark("construction")
    embedding, optimizer = _make_embedding(case, permitted, weights)
    model = pooled_model(embedding, case.ids_per_sample)
    model.compile(optimizer=optimizer, loss="mse")
    sample = FrozenSample(embedding, seed=case.seed) if case.variant in INT8_VARIANTS else None
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
    optimizer_variables = [
        *optimizer.variables,
        *getattr(optimizer, "compact_slot_variables", []),
    ]
    figures: dict[str, Any] = {
        "optimizer_bytes": _variables_bytes(optimizer_variables),
        "layer_variables": variable_bytes(embedding.variables),
        "optimizer_variables": variable_bytes(optimizer_variables),
        "allocator": allocator_figures(),
    }
    if sample is not None:
        figures.update(
            frozen_sample_rows=len(sample.ids), frozen_sample_unchanged=sample.unchanged()
        )
    return figures


def _run_stock_tf_case(case: MemoryCase, mark: Callable[[str], None]) -> dict[str, Any]:
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
    variables = [first, second, step_count, *head_optimizer.variables]
    return {"optimizer_bytes": _variables_bytes(variables)}


def _run_transient(case: MemoryCase, mark: Callable[[str], None]) -> dict[str, Any]:
    mark("construction")
    # Three times, each freed at once: a sampler that a busy machine holds
    # back for a moment still gets a chance at one of them.
    for _ in range(3):
        table = np.ones((case.vocab, case.width), dtype=np.float32)
        del table
    mark("first_step")
    mark("steady")
    mark(END)
    return {"optimizer_bytes": 0}


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
        if case.variant in INT8_VARIANTS:
            table = np.zeros((tiny.vocab, tiny.width), np.float32) + 0.01
            _run_keras_case(tiny, lambda phase: None, table)
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
        figures = _run_transient(case, mark)
    elif case.variant == "stock_tf":
        figures = _run_stock_tf_case(case, mark)
    else:
        weights = None if weights_path is None else np.load(weights_path, mmap_mode="r")
        figures = _run_keras_case(case, mark, weights)
    mark.result(figures)
