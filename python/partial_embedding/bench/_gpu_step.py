"""The GPU smoke check: ``python -m partial_embedding.bench --gpu-step``.

What a GPU user meets at the first training step, checked on the GPU that
TensorFlow sees, then timed against stock Keras in the same process (the ops
themselves are checked against their references by the GPU check's suite,
``build_tools/gpu_check.sh --tensorflow-ops``):

* ``model.fit`` of ``PartialEmbedding`` + ``MaskedOptimizer(Adam)`` with
  ``jit_compile`` left to Keras (``"auto"``: XLA on a GPU) and ``False``;
* the same with int8 frozen rows (``layer.quantize("int8")``);
* a tied ``PartialReversibleEmbedding`` language-model step under
  ``jit_compile=True``;
* in each: frozen rows bit for bit, looked-up permitted rows moved, and every
  variable the library made next to a table on the table's GPU (none in a
  dtype TensorFlow keeps in host memory there);
* the median step time of ours (kernel path and XLA) against
  ``keras.layers.Embedding`` + Adam (without and with XLA) at V = 1M and 8M,
  in interleaved rounds, and of the same model without its embedding (the
  head alone, fed an input of the embedding's output shape): the
  embedding's cost, a step minus the head's, ours against stock Keras's
  (issue #45: at most 1/5 of it, growing at most 1.2x from 1M to 8M).

``--timing-only`` times alone, where ``--device`` says (``/CPU:0`` with
small ``--vocabs`` tries it without a GPU; those are not GPU figures), and
prints its findings so far as one JSON line after ``TIMING_JSON_PREFIX``
after each V.

It prints one line per check and a JSON summary (also written to
``--json``, default ``$OUT/gpu_step.json`` when ``OUT`` is set), and exits 1
when a check fails, 2 when TensorFlow sees no GPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import partial_embedding as pe  # noqa: E402
from partial_embedding._loader import load_ops  # noqa: E402
from partial_embedding.bench._models import build_variant, keras_step, pooled_model  # noqa: E402

__all__ = [
    "COST_GROWTH_TARGET",
    "COST_RATIO_TARGET",
    "FUSED_OPS",
    "HOST_MEMORY_DTYPES",
    "TIMED_VARIANTS",
    "TIMING_JSON_PREFIX",
    "embedding_costs",
    "fit_check",
    "fused_op_calls",
    "head_model",
    "main",
    "print_embedding_costs",
    "run_checks",
    "tied_lm_check",
    "time_steps",
    "variables_made_by",
]

#: Variable dtypes that TensorFlow keeps in host memory on a GPU (its GPU
#: kernels for int32 tensors take them on the host), whatever the device scope
#: says: an XLA step on the GPU cannot reach such a variable.
HOST_MEMORY_DTYPES = (tf.int32,)

#: The op library's wrappers of the fused ops, which :func:`fused_op_calls`
#: counts.
FUSED_OPS = (
    "partial_embedding_masked_sparse_apply_rule",
    "partial_embedding_masked_sparse_apply_rule_with_slot_indices",
    "partial_embedding_quantized_lookup",
)


@contextlib.contextmanager
def fused_op_calls() -> Iterator[collections.Counter]:
    """Counts the calls of the fused ops' wrappers made inside: each eager
    run and each trace that puts one in a graph (a ``fit`` step traced with
    one runs it every step)."""
    ops = load_ops()
    calls: collections.Counter = collections.Counter()
    originals = {name: getattr(ops, name) for name in FUSED_OPS}

    def counting(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return originals[name](*args, **kwargs)

        return call

    try:
        for name in FUSED_OPS:
            setattr(ops, name, counting(name))
        yield calls
    finally:
        for name, original in originals.items():
            setattr(ops, name, original)


@contextlib.contextmanager
def variables_made_by() -> Iterator[list[tf.Variable]]:
    """Collects every ``tf.Variable`` made inside (eagerly or while tracing)."""
    made: list[tf.Variable] = []

    def creator(next_creator: Callable[..., tf.Variable], **kwargs: Any) -> tf.Variable:
        variable = next_creator(**kwargs)
        made.append(variable)
        return variable

    with tf.variable_creator_scope(creator):
        yield made


class Checks:
    """Named pass/fail results with their details."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def record(self, name: str, passed: bool, **detail: Any) -> None:
        self.results.append({"name": name, "passed": bool(passed), **detail})
        shown = ", ".join(f"{key}={value}" for key, value in detail.items())
        print(f"  {'PASS' if passed else 'FAIL'} {name}" + (f": {shown}" if shown else ""))
        sys.stdout.flush()

    def run(self, name: str, check: Callable[[], dict[str, Any]]) -> None:
        """Runs ``check`` (which returns ``passed`` and details), recording an
        exception as a failure."""
        try:
            detail = check()
        except Exception as error:  # noqa: BLE001 - reported as the check's failure
            self.record(name, False, error=f"{type(error).__name__}: {error}"[:2000])
            traceback.print_exc()
            return
        passed = detail.pop("passed")
        self.record(name, passed, **detail)

    @property
    def passed(self) -> bool:
        return all(result["passed"] for result in self.results)


def _on(variable: Any, device: str) -> bool:
    placed = getattr(variable, "device", "") or ""
    return (
        tf.DeviceSpec.from_string(placed).device_type
        == tf.DeviceSpec.from_string(device).device_type
    )


def _placement(made: Sequence[tf.Variable], device: str) -> dict[str, Any]:
    """Which of the variables are off ``device``, or of a host-memory dtype."""
    off = sorted({f"{v.name} ({v.dtype.name}) on {v.device}" for v in made if not _on(v, device)})
    host = sorted({f"{v.name} ({v.dtype.name})" for v in made if v.dtype in HOST_MEMORY_DTYPES})
    return {"variables": len(made), "off_device": off[:10], "host_dtype": host[:10]}


# -- training steps ----------------------------------------------------------------


def _ids(rng: np.random.Generator, vocab: int, batch: int, length: int, boost: np.ndarray) -> Any:
    ids = rng.integers(0, vocab, size=(batch, length))
    ids[:, 0] = rng.choice(boost, size=batch)  # every batch looks up permitted rows
    return ids.astype(np.int32)


def fit_check(
    jit_compile: Any, quantized: bool, rng: np.random.Generator, device: str
) -> dict[str, Any]:
    """``model.fit`` of a pooled ``PartialEmbedding`` (int8 frozen rows when
    ``quantized``) + ``MaskedOptimizer(Adam)`` built under ``device``, with
    ``jit_compile`` (``"auto"``: Keras' choice). Passes when frozen rows keep
    their bits, permitted rows moved, and every variable made is on
    ``device`` and of no host-memory dtype. ``fused_op_traces`` says which
    fused ops the step took (none under XLA on a GPU: the stock-op path)."""
    vocab, width, length = 5000, 16, 8
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    trainable = rng.choice(vocab, size=40, replace=False)
    ids = _ids(rng, vocab, 256, length, trainable)
    targets = rng.normal(size=(256, 1)).astype(np.float32)
    with variables_made_by() as made, fused_op_calls() as calls, tf.device(device):
        layer = pe.PartialEmbedding(vocab, width, weights=table, trainable_ids=trainable)
        model = keras.Sequential(
            [
                keras.Input((length,), dtype="int32"),
                layer,
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        if quantized:
            layer.quantize("int8")
            before = layer._embeddings.numpy().copy()
            store_before = layer.float_rows.numpy().copy()
        else:
            before = layer.embeddings.numpy().copy()
        compile_args = {} if jit_compile == "auto" else {"jit_compile": jit_compile}
        model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse",
                      **compile_args)  # fmt: skip
        history = model.fit(ids, targets, batch_size=64, epochs=2, verbose=0)
    losses = history.history["loss"]
    looked_up = np.intersect1d(np.unique(ids), trainable)
    if quantized:
        after = layer._embeddings.numpy()
        frozen_kept = bool(np.array_equal(after, before))
        store = layer.float_rows.numpy()
        moved = bool(np.any(store != store_before))
    else:
        after = layer.embeddings.numpy()
        frozen = np.setdiff1d(np.arange(vocab), trainable)
        frozen_kept = bool(np.array_equal(after[frozen], before[frozen]))
        moved = bool(np.all(np.any(after[looked_up] != before[looked_up], axis=1)))
    placement = _placement(made, device)
    return {
        "passed": frozen_kept
        and moved
        and bool(np.all(np.isfinite(losses)))
        and not placement["off_device"]
        and not placement["host_dtype"],
        "jit_compile": str(getattr(model, "jit_compile", jit_compile)),
        "loss": [round(float(loss), 4) for loss in losses],
        "frozen_bit_for_bit": frozen_kept,
        "permitted_moved": moved,
        "fused_op_traces": dict(calls),
        **placement,
    }


def tied_lm_check(rng: np.random.Generator, device: str) -> dict[str, Any]:
    """Three XLA steps of a tied ``PartialReversibleEmbedding`` language model
    built under ``device``, with the checks of :func:`fit_check`."""
    vocab, width = 3000, 32
    pretrained = rng.normal(size=(vocab, width)).astype(np.float32)
    new_tokens = np.arange(vocab - 20, vocab)
    tokens = rng.integers(0, vocab, size=(16, 12))
    tokens[:, ::3] = rng.choice(new_tokens, size=(16, 4))
    with variables_made_by() as made, tf.device(device):
        embedding = pe.PartialReversibleEmbedding(
            vocab, width, weights=pretrained, trainable_ids=new_tokens
        )
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.01))
        embedding.build((None, None))
        variables = embedding.trainable_variables
        optimizer.build(variables)

        @tf.function(jit_compile=True)
        def step(batch: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                hidden = embedding(batch[:, :-1])
                logits = embedding(hidden, reverse=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        batch[:, 1:], logits, from_logits=True
                    )
                )
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss

        losses = [float(step(tf.constant(tokens, tf.int32))) for _ in range(3)]
    after = embedding.embeddings.numpy()
    frozen_kept = bool(np.array_equal(after[: vocab - 20], pretrained[: vocab - 20]))
    moved = bool(np.any(after[vocab - 20 :] != pretrained[vocab - 20 :]))
    placement = _placement(made, device)
    return {
        "passed": frozen_kept
        and moved
        and not placement["off_device"]
        and not placement["host_dtype"],
        "loss": [round(loss, 4) for loss in losses],
        "frozen_bit_for_bit": frozen_kept,
        "permitted_moved": moved,
        **placement,
    }


# -- timing ---------------------------------------------------------------------------

#: The targets of issue #45 for the embedding's cost (a step's time minus the
#: same model's step without the embedding): ours at most this fraction of
#: stock Keras's, measured the same way ...
COST_RATIO_TARGET = 0.2
#: ... and ours growing at most this much from the smallest to the largest V.
COST_GROWTH_TARGET = 1.2

#: What ``--timing-only`` prints before its findings' one JSON line
#: (build_tools/device_check_report.py reads it from the log).
TIMING_JSON_PREFIX = "GPU_STEP_TIMING_JSON "

#: The timed variants: (name, what builds it, jit_compile, the inputs it takes).
TIMED_VARIANTS = (
    ("partial", "partial", False, "ids"),
    ("partial_xla", "partial_xla", True, "ids"),
    ("keras", "keras", False, "ids"),
    ("keras_xla", "keras", True, "ids"),
    ("head", "head", False, "features"),
    ("head_xla", "head", True, "features"),
)
#: Per XLA mode: the variants of ours, stock Keras's and the head alone.
_MODES = {"no_xla": ("partial", "keras", "head"), "xla": ("partial_xla", "keras_xla", "head_xla")}


def head_model(ids_per_sample: int, width: int) -> keras.Model:
    """The timed models without their embedding: the embedding's output, an
    input of its shape, feeding the same head (pooling and ``Dense(1)``)."""
    inputs = keras.Input((ids_per_sample, width))
    pooled = keras.layers.GlobalAveragePooling1D()(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(pooled))


def _timed_variants(
    vocab: int, width: int, ids_per_sample: int, seed: int, device: str, failed: dict[str, str]
) -> dict[str, tuple[Callable, list[Any], str]]:
    """Each of ``TIMED_VARIANTS`` built on ``device``: its step, what it keeps
    alive and the inputs it takes; one that fails to build is left out, its
    error in ``failed``."""
    rng = np.random.default_rng(seed)
    permitted = np.zeros(vocab, bool)
    permitted[rng.choice(vocab, size=max(1, vocab // 100), replace=False)] = True
    variants: dict[str, tuple[Callable, list[Any], str]] = {}
    with tf.device(device):
        for name, built_as, jit_compile, inputs in TIMED_VARIANTS:
            try:
                variants[name] = (*_built(built_as, jit_compile, vocab, width, permitted,
                                          ids_per_sample), inputs)  # fmt: skip
            except Exception as error:  # noqa: BLE001 - reported, the others still timed
                failed[name] = f"building: {type(error).__name__}: {error}"[:500]
    return variants


def _built(
    built_as: str,
    jit_compile: bool,
    vocab: int,
    width: int,
    permitted: np.ndarray,
    ids_per_sample: int,
) -> tuple[Callable, list[Any]]:
    """A timed variant's step and what it keeps alive."""
    if built_as == "head":
        model, optimizer = head_model(ids_per_sample, width), keras.optimizers.Adam()
        return keras_step(model, optimizer, jit_compile), [model, optimizer]
    if built_as == "keras" and jit_compile:
        model = pooled_model(keras.layers.Embedding(vocab, width), ids_per_sample)
        optimizer = keras.optimizers.Adam()
        return keras_step(model, optimizer, jit_compile=True), [model, optimizer]
    return build_variant(built_as, vocab, width, permitted, ids_per_sample)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 3)


def _difference(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else round(first - second, 4)


def embedding_costs(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue #45's figures from :func:`time_steps`' rows: per XLA mode and V,
    the embedding's cost (the step minus the head-only step) of ours and of
    stock Keras, their ratio against ``COST_RATIO_TARGET``; per mode, the
    growth of our cost from the smallest to the largest V against
    ``COST_GROWTH_TARGET``. Stock's cost at or below zero (within the noise of
    the head alone), or a variant that failed, gives no ratio, and a target
    without its ratio is not met; ours at or below zero gives the ratio 0."""
    figures: dict[str, Any] = {}
    for mode, (ours, stock, head) in _MODES.items():
        per_vocab = []
        for row in rows:
            ours_cost = _difference(row.get(f"{ours}_ms"), row.get(f"{head}_ms"))
            keras_cost = _difference(row.get(f"{stock}_ms"), row.get(f"{head}_ms"))
            ratio = _ratio(ours_cost, keras_cost)
            if ratio is not None and ours_cost is not None and ours_cost <= 0:
                ratio = 0.0
            per_vocab.append(
                {
                    "vocab": row["vocab"],
                    "ours_cost_ms": ours_cost,
                    "keras_cost_ms": keras_cost,
                    "ours_cost_over_keras_cost": ratio,
                    "target": COST_RATIO_TARGET,
                    "met": ratio is not None and ratio <= COST_RATIO_TARGET,
                }
            )
        growth: dict[str, Any] = {"target": COST_GROWTH_TARGET, "ratio": None, "met": False}
        if len(per_vocab) > 1:
            first, last = per_vocab[0], per_vocab[-1]
            growth.update(
                {
                    "from_vocab": first["vocab"],
                    "to_vocab": last["vocab"],
                    "ratio": _ratio(last["ours_cost_ms"], first["ours_cost_ms"]),
                }
            )
            growth["met"] = growth["ratio"] is not None and growth["ratio"] <= COST_GROWTH_TARGET
        figures[mode] = {"per_vocab": per_vocab, "ours_cost_growth": growth}
    return figures


def time_steps(
    vocabs: Sequence[int],
    width: int,
    ids_per_sample: int,
    batch: int,
    rounds: int,
    steps: int,
    device: str = "/GPU:0",
) -> list[dict[str, Any]]:
    """Median milliseconds per step of each of ``TIMED_VARIANTS`` on
    ``device``, in interleaved rounds (each variant's ``steps`` steps in
    turn, ``rounds`` times), one row per V: ours (``PartialEmbedding`` +
    ``MaskedOptimizer(Adam)``), stock ``keras.layers.Embedding`` + Adam and
    the head alone (:func:`head_model`), each without and with XLA, and the
    ratios of whole steps, stock over ours. A variant that fails to build or
    to run has no time (None) and its error in the row's ``failed``; the
    others are still timed. :func:`embedding_costs` turns the rows into the
    embedding's costs."""
    rows = []
    for vocab in vocabs:
        failed: dict[str, str] = {}
        variants = _timed_variants(vocab, width, ids_per_sample, vocab, device, failed)
        rng = np.random.default_rng(1)
        with tf.device(device):
            inputs = {
                "ids": [
                    tf.constant(rng.integers(0, vocab, size=(batch, ids_per_sample)), tf.int32)
                    for _ in range(steps)
                ],
                "features": [
                    tf.constant(rng.normal(size=(batch, ids_per_sample, width)), tf.float32)
                    for _ in range(steps)
                ],
            }
            targets = [tf.constant(rng.normal(size=(batch, 1)), tf.float32) for _ in range(steps)]
        medians = _medians(variants, inputs, targets, rounds, failed)
        row: dict[str, Any] = {
            "vocab": vocab,
            "width": width,
            "batch": batch,
            "ids_per_sample": ids_per_sample,
        }
        row.update({f"{name}_ms": medians.get(name) for name, *_ in TIMED_VARIANTS})
        row["keras_over_partial"] = _ratio(medians.get("keras"), medians.get("partial"))
        row["keras_xla_over_partial_xla"] = _ratio(
            medians.get("keras_xla"), medians.get("partial_xla")
        )
        row["failed"] = dict(failed)
        rows.append(row)
        shown = {
            name: "failed" if ms is None else f"{ms:.3f}"
            for name, ms in ((name, medians.get(name)) for name, *_ in TIMED_VARIANTS)
        }
        print(
            f"  V={vocab:,}: ours {shown['partial']} ms (XLA {shown['partial_xla']}),"
            f" keras.layers.Embedding + Adam {shown['keras']} ms (XLA {shown['keras_xla']}):"
            f" {row['keras_over_partial']}x / {row['keras_xla_over_partial_xla']}x;"
            f" head alone {shown['head']} ms (XLA {shown['head_xla']})"
        )
        for name, error in failed.items():
            print(f"  V={vocab:,}: {name} FAILED: {error}")
        sys.stdout.flush()
        del variants
        keras.backend.clear_session()
    return rows


def _medians(
    variants: dict[str, tuple[Callable, list[Any], str]],
    inputs: dict[str, list[Any]],
    targets: list[Any],
    rounds: int,
    failed: dict[str, str],
) -> dict[str, float]:
    """Median milliseconds per step of each variant, in interleaved rounds;
    one whose first steps (trace, compile, warm-up) fail is left out, its
    error in ``failed``."""
    running = {}
    for name, (step, _, kind) in variants.items():
        try:
            for first, target in list(zip(inputs[kind], targets))[:3]:
                float(step(first, target))  # trace, compile, warm up
            running[name] = (step, kind)
        except Exception as error:  # noqa: BLE001 - reported, the others still timed
            failed[name] = f"running: {type(error).__name__}: {error}"[:500]
    per_step: dict[str, list[float]] = {name: [] for name in running}
    for _ in range(rounds):
        for name, (step, kind) in running.items():
            start = time.perf_counter()
            for first, target in zip(inputs[kind], targets):
                loss = step(first, target)
            float(loss)  # waits for the device
            per_step[name].append((time.perf_counter() - start) / len(targets) * 1e3)
    return {name: round(statistics.median(times), 4) for name, times in per_step.items()}


def _shown_ms(milliseconds: float | None) -> str:
    return "n/a (a variant failed)" if milliseconds is None else f"{milliseconds:.3f} ms"


def print_embedding_costs(figures: dict[str, Any]) -> None:
    """One line per XLA mode and V, and per mode the growth, each against its target."""
    for mode, found in figures.items():
        for entry in found["per_vocab"]:
            print(
                f"  embedding cost, {mode}, V={entry['vocab']:,}:"
                f" ours {_shown_ms(entry['ours_cost_ms'])},"
                f" keras.layers.Embedding + Adam {_shown_ms(entry['keras_cost_ms'])}:"
                f" ours/keras {entry['ours_cost_over_keras_cost']}"
                f" (target <= {entry['target']}): {'met' if entry['met'] else 'NOT met'}"
            )
        growth = found["ours_cost_growth"]
        shown = growth["ratio"] if growth["ratio"] is not None else "n/a "
        if "from_vocab" in growth:
            print(
                f"  embedding cost growth, {mode}, V={growth['from_vocab']:,} ->"
                f" {growth['to_vocab']:,}: ours {shown}x"
                f" (target <= {growth['target']}x): {'met' if growth['met'] else 'NOT met'}"
            )
    sys.stdout.flush()


# -- the whole check -----------------------------------------------------------------


def run_checks(seed: int, device: str = "/GPU:0") -> Checks:
    """Runs every correctness check on ``device``; returns the results."""
    checks = Checks()
    rng = np.random.default_rng(seed)
    for quantized in (False, True):
        for jit_compile in ("auto", False, True):
            label = "int8 frozen rows" if quantized else "float table"
            checks.run(
                f"fit {label}, jit_compile={jit_compile}",
                functools.partial(fit_check, jit_compile, quantized, rng, device),
            )
    checks.run("tied LM step, jit_compile=True", lambda: tied_lm_check(rng, device))
    return checks


def _timing(arguments: argparse.Namespace, device: str) -> dict[str, Any]:
    print(f"step time on {device}, median of {arguments.rounds} interleaved rounds of"
          f" {arguments.steps} steps:")  # fmt: skip
    rows = time_steps(
        arguments.vocabs,
        arguments.width,
        arguments.ids_per_sample,
        arguments.batch,
        arguments.rounds,
        arguments.steps,
        device,
    )
    costs = embedding_costs(rows)
    print_embedding_costs(costs)
    return {"rows": rows, "embedding_cost": costs}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --gpu-step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seed", type=int, default=0, help="inputs' seed (default 0)")
    parser.add_argument(
        "--vocabs", type=int, nargs="+", default=[1_000_000, 8_000_000], help="timed table rows"
    )
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ids-per-sample", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--no-timing", action="store_true", help="the checks only")
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="the timing only (and the embedding's cost, issue #45), printed after "
        f"{TIMING_JSON_PREFIX!r} as one JSON line after each V",
    )
    parser.add_argument(
        "--device",
        default="/GPU:0",
        help="where --timing-only times (default /GPU:0; /CPU:0 to try it without a GPU: "
        "then the figures are no GPU figures)",
    )
    parser.add_argument("--json", default=None, help="where to write the summary")
    return parser


def _timing_only(arguments: argparse.Namespace, gpus: list[Any]) -> dict[str, Any]:
    """``--timing-only``: the timing where ``--device`` says, the findings as
    one JSON line after each V (a run stopped part way keeps the Vs it timed)."""
    on_gpu = tf.DeviceSpec.from_string(arguments.device).device_type == "GPU"
    if on_gpu and not gpus:
        print("TensorFlow sees no GPU: nothing to time (--device /CPU:0 times on the CPU)")
        raise SystemExit(2)
    found: dict[str, Any] = {
        "device": arguments.device,
        "gpu_figures": on_gpu,
        "note": None if on_gpu else "timed on the CPU: these are not GPU figures",
        "gpu_fused_opt_in": os.environ.get("PARTIAL_EMBEDDING_GPU_FUSED") == "1",
        "rows": [],
    }
    print(f"step time on {arguments.device}, median of {arguments.rounds} interleaved rounds of"
          f" {arguments.steps} steps:")  # fmt: skip
    for vocab in arguments.vocabs:
        found["rows"] += time_steps(
            [vocab],
            arguments.width,
            arguments.ids_per_sample,
            arguments.batch,
            arguments.rounds,
            arguments.steps,
            arguments.device,
        )
        found["embedding_cost"] = embedding_costs(found["rows"])
        found["complete"] = len(found["rows"]) == len(arguments.vocabs)
        print(TIMING_JSON_PREFIX + json.dumps(found), flush=True)
    print_embedding_costs(found["embedding_cost"])
    if found["note"]:
        print(f"NOTE: {found['note']}")
    return found


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    arguments = _parser().parse_args(argv)
    gpus = tf.config.list_physical_devices("GPU")
    print(f"partial_embedding.bench --gpu-step: TensorFlow {tf.__version__}, GPUs {gpus}")
    if arguments.timing_only:
        return _timing_only(arguments, gpus)
    if not gpus:
        print("TensorFlow sees no GPU: nothing to check")
        raise SystemExit(2)
    info = pe.build_info()
    print(f"op library: cuda={info.get('cuda')}, toolchain={info.get('cuda_toolchain')}")
    print(f"checks (seed {arguments.seed}):")
    checks = run_checks(arguments.seed)
    timing: list[dict[str, Any]] = []
    costs: dict[str, Any] = {}
    if not arguments.no_timing:
        timed = _timing(arguments, "/GPU:0")
        timing, costs = timed["rows"], timed["embedding_cost"]
    summary = {
        "tensorflow": tf.__version__,
        "gpu": tf.config.experimental.get_device_details(gpus[0]).get("device_name", ""),
        "build": {key: info.get(key) for key in ("cuda", "cuda_toolchain", "cuda_architectures")},
        "seed": arguments.seed,
        "passed": checks.passed,
        "checks": checks.results,
        "timing": timing,
        "embedding_cost": costs,
    }
    path = arguments.json or (
        os.path.join(os.environ["OUT"], "gpu_step.json") if os.environ.get("OUT") else None
    )
    if path:
        with open(path, "w") as out:
            json.dump(summary, out, indent=1)
    print(json.dumps({key: summary[key] for key in ("gpu", "passed", "timing")}, indent=1))
    failed = [result["name"] for result in checks.results if not result["passed"]]
    print("PASSED" if not failed else f"FAILED: {', '.join(failed)}")
    if failed:
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    main()
