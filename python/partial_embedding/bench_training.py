"""Training-step benchmark: PartialEmbedding + MaskedOptimizer(Adam) vs. the rest.

Run ``python -m partial_embedding.bench_training`` (``--help`` for options).
One run times a training step (forward, backward, optimizer update) of the
same small model, an embedding of ``V x D`` whose ids are mean-pooled into a
``Dense(1)``, trained on mean squared error with Adam, built four ways:

* ``partial``: ``PartialEmbedding`` + ``MaskedOptimizer(Adam)`` (this library);
* ``keras``: stock ``keras.layers.Embedding`` + ``Adam`` (trains every row;
  Keras densifies the update: every row and slot rewritten per step);
* ``dense_mask``: the widely copied layer
  ``stop_gradient(mask * W) + (1 - mask) * W`` + ``Adam``;
* ``stock_tf``: the best with stock TF ops alone: lookups by ``ResourceGather``,
  ``tf.unique`` + ``unsorted_segment_sum``, row gathers, lazy Adam on the
  permitted rows, ``scatter_update`` of the table and both moments.

It then times the optimizer update alone, ``partial`` against ``stock_tf``
fed the same fixed sparse gradients (the part of the step that the fused
kernel replaces), ``partial`` again at other vocabulary sizes (the step must not
grow with V), and reports each variant's peak resident-memory growth over its
timed steps (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) and,
where TensorFlow's CPU allocator keeps statistics (oneDNN builds, the default
on x86, whose pooled allocator also hides per-step allocations from the RSS),
the most memory TensorFlow held at once during them beyond what it held
before: both next to the size of one table.

``run_benchmark`` returns the figures as a dict for other modules.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402

__all__ = ["run_benchmark", "main"]

VARIANTS = ("partial", "keras", "dense_mask", "stock_tf")


# -- memory ------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _tf_cpu_allocator_bytes(reset_peak: bool = False) -> dict[str, int] | None:
    """TensorFlow's CPU allocator statistics (current and peak bytes in use),
    or None where the allocator keeps none. oneDNN builds (the default on
    x86) pool CPU memory, which hides per-step allocations from the RSS."""
    try:
        if reset_peak:
            tf.config.experimental.reset_memory_stats("CPU:0")
        info = tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, tf.errors.OpError, RuntimeError):
        return None
    return {"current": int(info["current"]), "peak": int(info["peak"])}


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


# -- models ------------------------------------------------------------------


class _DenseMaskEmbedding(keras.layers.Layer):
    """The widely copied answer: a whole-table masked copy before each lookup.

    ``mask`` is 1 for frozen rows; the gradient is dense and every row is
    rewritten by the optimizer.
    """

    def __init__(self, vocab: int, width: int, frozen: np.ndarray) -> None:
        super().__init__()
        self.table = self.add_weight(shape=(vocab, width), initializer="uniform")
        self.frozen = tf.constant(frozen.astype(np.float32)[:, None])

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        table = tf.convert_to_tensor(self.table)
        masked = tf.stop_gradient(self.frozen * table) + (1.0 - self.frozen) * table
        return tf.gather(masked, ids)


def _pooled_model(embedding: keras.layers.Layer, ids_per_sample: int) -> keras.Model:
    inputs = keras.Input((ids_per_sample,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(embedding(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(pooled))


def _keras_step(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> Callable:
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True) - targets))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def _stock_tf_update(
    tables: tuple[tf.Variable, tf.Variable, tf.Variable],
    mask: tf.Variable,
    step_count: tf.Variable,
    table_grad: tf.IndexedSlices,
    lr: float = 1e-3,
) -> None:
    """Lazy masked Adam on the permitted rows, with stock TF ops only."""
    table, first, second = tables
    beta_1, beta_2, epsilon = 0.9, 0.999, 1e-7
    unique, positions = tf.unique(table_grad.indices)
    summed = tf.math.unsorted_segment_sum(table_grad.values, positions, tf.shape(unique)[0])
    keep = tf.gather(mask, unique)
    unique = tf.boolean_mask(unique, keep)
    grad = tf.boolean_mask(summed, keep)
    t = tf.cast(step_count.assign_add(1), tf.float32)
    alpha = lr * tf.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    m = tf.gather(first, unique) * beta_1 + (1 - beta_1) * grad
    v = tf.gather(second, unique) * beta_2 + (1 - beta_2) * tf.square(grad)
    new_rows = tf.gather(table, unique) - alpha * m / (tf.sqrt(v) + epsilon)
    first.scatter_update(tf.IndexedSlices(m, unique))
    second.scatter_update(tf.IndexedSlices(v, unique))
    table.scatter_update(tf.IndexedSlices(new_rows, unique))


def _stock_tf_tables(
    vocab: int, width: int, permitted: np.ndarray
) -> tuple[tuple[tf.Variable, tf.Variable, tf.Variable], tf.Variable, tf.Variable]:
    table = tf.Variable(tf.random.uniform([vocab, width], -0.05, 0.05))
    first = tf.Variable(tf.zeros([vocab, width]))
    second = tf.Variable(tf.zeros([vocab, width]))
    return (table, first, second), tf.Variable(permitted), tf.Variable(0, dtype=tf.int64)


def _stock_tf_step(
    vocab: int, width: int, permitted: np.ndarray, ids_per_sample: int, lr: float = 1e-3
) -> tuple[Callable, list[Any]]:
    """Lazy masked Adam with stock TF ops only (variables in plain tf.Variable)."""
    tables, mask, step_count = _stock_tf_tables(vocab, width, permitted)
    table = tables[0]
    head = keras.layers.Dense(1)
    head.build((None, width))
    head_optimizer = keras.optimizers.Adam(lr)
    head_optimizer.build(head.trainable_variables)

    @tf.function
    def step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            rows = tf.nn.embedding_lookup(table, ids)  # ResourceGather
            prediction = head(tf.reduce_mean(rows, axis=1))
            loss = tf.reduce_mean(tf.square(prediction - targets))
        table_grad, *head_grads = tape.gradient(loss, [table, *head.trainable_variables])
        head_optimizer.apply(head_grads, head.trainable_variables)
        _stock_tf_update(tables, mask, step_count, table_grad, lr)
        return loss

    return step, [*tables, mask, step_count, head, head_optimizer]


def _build_variant(
    variant: str, vocab: int, width: int, permitted: np.ndarray, ids_per_sample: int
) -> tuple[Callable, list[Any]]:
    if variant == "stock_tf":
        return _stock_tf_step(vocab, width, permitted, ids_per_sample)
    if variant == "partial":
        embedding = PartialEmbedding(vocab, width, trainable_ids=permitted)
        optimizer = MaskedOptimizer(keras.optimizers.Adam())
    elif variant == "keras":
        embedding = keras.layers.Embedding(vocab, width)
        optimizer = keras.optimizers.Adam()
    elif variant == "dense_mask":
        embedding = _DenseMaskEmbedding(vocab, width, ~permitted)
        optimizer = keras.optimizers.Adam()
    else:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    model = _pooled_model(embedding, ids_per_sample)
    return _keras_step(model, optimizer), [model, optimizer]


# -- timing ------------------------------------------------------------------


def _interleaved_rounds(
    runs: dict[str, tuple[Callable, list[tuple[Any, ...]]]], steps: int, warmup: int
) -> dict[str, dict[str, float]]:
    """Times each run's function in interleaved rounds; figures per run.

    ``runs`` maps a name to a function and the argument tuples it cycles
    through. Every function is warmed up first, then they are timed round by
    round in turn (the order alternating between rounds), so slow drifts of a
    shared machine reach each of them alike. Each keeps its best round (the
    one least disturbed by other processes), the mean over all rounds, and
    the most memory any of its rounds added (RSS, and TF's CPU allocator where
    it keeps statistics).
    """
    for function, inputs in runs.values():
        for i in range(warmup):
            function(*inputs[i % len(inputs)]).numpy()
    gc.collect()
    rounds = max(1, min(5, steps // 10))
    per_round = max(1, steps // rounds)
    names = list(runs)
    round_ms: dict[str, list[float]] = {name: [] for name in names}
    rss_growth: dict[str, list[float]] = {name: [] for name in names}
    alloc_growth: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            function, inputs = runs[name]
            rss_before = _status_kib("VmRSS")
            can_reset = _reset_peak_rss()
            allocator_before = _tf_cpu_allocator_bytes(reset_peak=True)
            start = time.perf_counter()
            for i in range(per_round):
                last = function(*inputs[(r * per_round + i) % len(inputs)])
            last.numpy()
            round_ms[name].append(1e3 * (time.perf_counter() - start) / per_round)
            peak = _status_kib("VmHWM")
            if can_reset and peak is not None and rss_before is not None:
                rss_growth[name].append(max(0, peak - rss_before) / 1024)
            allocator_after = _tf_cpu_allocator_bytes()
            if allocator_before is not None and allocator_after is not None:
                # The most TensorFlow held at once during the round, beyond
                # what it held before it: the per-step temporaries.
                alloc_growth[name].append(
                    max(0, allocator_after["peak"] - allocator_before["current"]) / 2**20
                )
    results: dict[str, dict[str, float]] = {}
    for name in names:
        result = {
            "step_ms": min(round_ms[name]),
            "mean_step_ms": float(np.mean(round_ms[name])),
            "steps": rounds * per_round,
        }
        if rss_growth[name]:
            result["peak_rss_growth_mib"] = max(rss_growth[name])
        if alloc_growth[name]:
            result["peak_step_alloc_mib"] = max(alloc_growth[name])
        results[name] = result
    return results


def _time_variants(
    variants: Sequence[str],
    vocab: int,
    width: int,
    batch: int,
    ids_per_sample: int,
    permitted_fraction: float,
    steps: int,
    warmup: int,
    rng: np.random.Generator,
) -> dict[str, dict[str, float]]:
    """Builds the variants and times their training steps, interleaved."""
    permitted = rng.random(vocab) < permitted_fraction
    built = {
        variant: _build_variant(variant, vocab, width, permitted, ids_per_sample)
        for variant in variants
    }
    batches = [
        (
            tf.constant(rng.integers(0, vocab, (batch, ids_per_sample)), tf.int32),
            tf.constant(rng.normal(size=(batch, 1)), tf.float32),
        )
        for _ in range(min(steps, 16))
    ]
    results = _interleaved_rounds(
        {variant: (step, batches) for variant, (step, _) in built.items()}, steps, warmup
    )
    del built, batches
    keras.backend.clear_session()
    gc.collect()
    return results


def _update_only_runs(
    vocab: int, width: int, permitted: np.ndarray
) -> dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]:
    """The optimizer update alone, as a function of a sparse gradient's
    indices and values: ``partial`` is ``MaskedOptimizer(Adam).apply``,
    ``stock_tf`` the same lazy masked Adam written with stock TF ops."""
    dense_shape = tf.constant([vocab, width], tf.int32)
    layer = PartialEmbedding(vocab, width, trainable_ids=permitted)
    layer.build((None,))
    optimizer = MaskedOptimizer(keras.optimizers.Adam())
    optimizer.build([layer.embeddings])
    tables, mask, step_count = _stock_tf_tables(vocab, width, permitted)

    @tf.function
    def partial_update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        gradient = tf.IndexedSlices(values, indices, dense_shape)
        optimizer.apply([gradient], [layer.embeddings])
        return optimizer.iterations

    @tf.function
    def stock_tf_update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        _stock_tf_update(tables, mask, step_count, tf.IndexedSlices(values, indices))
        return step_count.read_value()

    return {"partial": partial_update, "stock_tf": stock_tf_update}


def _time_updates_only(
    vocab: int,
    width: int,
    num_ids: int,
    permitted_fraction: float,
    steps: int,
    warmup: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Best-round ms of the optimizer update alone (``_update_only_runs``),
    both fed the same fixed sparse gradients in interleaved rounds: the part
    of the step that the fused kernel replaces."""
    permitted = rng.random(vocab) < permitted_fraction
    gradients = [
        (
            tf.constant(rng.integers(0, vocab, num_ids), tf.int32),
            tf.constant(rng.normal(size=(num_ids, width)) * 1e-3, tf.float32),
        )
        for _ in range(min(steps, 16))
    ]
    updates = _update_only_runs(vocab, width, permitted)
    figures = _interleaved_rounds(
        {name: (update, gradients) for name, update in updates.items()}, steps, warmup
    )
    del updates, gradients
    keras.backend.clear_session()
    gc.collect()
    return {name: result["step_ms"] for name, result in figures.items()}


def run_benchmark(
    vocab: int = 1_000_000,
    width: int = 128,
    batch: int = 256,
    ids_per_sample: int = 16,
    permitted_fraction: float = 0.5,
    steps: int = 100,
    baseline_steps: int = 5,
    warmup: int = 3,
    scaling_vocabs: Sequence[int] = (100_000, 4_000_000),
    variants: Sequence[str] = VARIANTS,
    seed: int | None = None,
    verbose: bool = True,
    update_only_steps: int = 100,
) -> dict[str, Any]:
    """Times a training step of each variant; returns the figures.

    Args:
      vocab, width: Table shape ``V x D`` of the comparison.
      batch, ids_per_sample: Each step looks up ``batch x ids_per_sample`` ids.
      permitted_fraction: Fraction of rows that may learn (chosen at random).
      steps: Timed steps of ``partial`` and ``stock_tf``.
      baseline_steps: Timed steps of ``keras`` and ``dense_mask`` (slow).
      warmup: Untimed steps first (tracing, first-touch of the slots).
      scaling_vocabs: Other vocabulary sizes at which ``partial`` is timed.
      variants: Which of ``partial``, ``keras``, ``dense_mask``, ``stock_tf``.
      seed: Seed of the ids and masks; None for fresh randomness.
      verbose: Print a table as figures come in.
      update_only_steps: Timed steps of the optimizer update alone (``partial``
        against ``stock_tf``, same fixed gradients); 0 skips it.

    Returns:
      ``{"config": ..., "variants": {name: {"step_ms" (best round of up to
      5), "mean_step_ms", "steps", "peak_rss_growth_mib", "peak_step_alloc_mib"
      (TF's CPU allocator, where it keeps statistics)}}, "ratios": {"<name>_over_partial": x},
      "update_only": {"partial": ms, "stock_tf": ms, "stock_tf_over_partial": x}
      (empty when skipped),
      "scaling": {V: step_ms}, "scaling_ratio": step(max V) / step(min V),
      "table_mib": one table's size}``.
    """
    rng = np.random.default_rng(seed)
    table_mib = vocab * width * 4 / 2**20
    config = dict(
        vocab=vocab,
        width=width,
        batch=batch,
        ids_per_sample=ids_per_sample,
        permitted_fraction=permitted_fraction,
        steps=steps,
        baseline_steps=baseline_steps,
    )
    say = print if verbose else (lambda *a, **k: None)
    say(
        f"V={vocab:,} D={width} batch={batch}x{ids_per_sample} ids, "
        f"{permitted_fraction:.0%} of rows permitted; one table = {table_mib:.0f} MiB"
    )
    results: dict[str, dict[str, float]] = {}
    # The fast variants are timed together, round by round in turn; the slow
    # baselines (seconds per step) each on their own.
    fast = [v for v in variants if v in ("partial", "stock_tf")]
    groups = ([fast] if fast else []) + [[v] for v in variants if v not in fast]
    for group in groups:
        count = steps if group == fast else baseline_steps
        results.update(
            _time_variants(
                group,
                vocab,
                width,
                batch,
                ids_per_sample,
                permitted_fraction,
                count,
                warmup,
                rng,
            )
        )
        for variant in group:
            figures = results[variant]
            say(
                f"  {variant:<11} {figures['step_ms']:9.3f} ms/step "
                f"(mean {figures['mean_step_ms']:9.3f}) "
                f"(peak RSS growth {figures.get('peak_rss_growth_mib', float('nan')):8.1f} "
                f"MiB, TF temporaries {figures.get('peak_step_alloc_mib', float('nan')):8.1f} "
                f"MiB, over {count} steps)"
            )
    results = {variant: results[variant] for variant in variants}
    ratios = {}
    if "partial" in results:
        base = results["partial"]["step_ms"]
        for variant, figures in results.items():
            if variant != "partial":
                ratios[f"{variant}_over_partial"] = figures["step_ms"] / base
        for name, ratio in ratios.items():
            say(f"  {name:<26} {ratio:8.1f}x")
    update_only: dict[str, float] = {}
    if update_only_steps and "partial" in results and "stock_tf" in results:
        update_only = _time_updates_only(
            vocab,
            width,
            batch * ids_per_sample,
            permitted_fraction,
            update_only_steps,
            warmup,
            rng,
        )
        update_only["stock_tf_over_partial"] = update_only["stock_tf"] / update_only["partial"]
        say(
            f"  optimizer update alone ({batch * ids_per_sample:,} gradient rows): "
            f"partial {update_only['partial']:.3f} ms, stock_tf {update_only['stock_tf']:.3f} ms, "
            f"{update_only['stock_tf_over_partial']:.1f}x"
        )
    scaling: dict[int, float] = {}
    if scaling_vocabs:
        if "partial" in results:
            scaling[vocab] = results["partial"]["step_ms"]
        for other in scaling_vocabs:
            if other == vocab and other in scaling:
                continue
            figures = _time_variants(
                ["partial"],
                other,
                width,
                batch,
                ids_per_sample,
                permitted_fraction,
                steps,
                warmup,
                rng,
            )["partial"]
            scaling[other] = figures["step_ms"]
            say(
                f"  partial at V={other:>10,}: {figures['step_ms']:.3f} ms/step "
                f"(peak RSS growth "
                f"{figures.get('peak_rss_growth_mib', float('nan')):.1f} MiB)"
            )
    scaling_ratio = None
    if len(scaling) >= 2:
        scaling_ratio = scaling[max(scaling)] / scaling[min(scaling)]
        say(
            f"  step time V={max(scaling):,} / V={min(scaling):,}: "
            f"{scaling_ratio:.2f}x (target <= 1.3x)"
        )
    return {
        "config": config,
        "variants": results,
        "ratios": ratios,
        "update_only": update_only,
        "scaling": scaling,
        "scaling_ratio": scaling_ratio,
        "table_mib": table_mib,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line entry point; prints the figures and returns them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ids-per-sample", type=int, default=16)
    parser.add_argument("--permitted-fraction", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--baseline-steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--scaling-vocabs",
        type=int,
        nargs="*",
        default=[100_000, 4_000_000],
        help="other V at which to time partial (none: skip)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--update-only-steps",
        type=int,
        default=100,
        help="timed steps of the optimizer update alone (0: skip)",
    )
    args = parser.parse_args(argv)
    return run_benchmark(
        vocab=args.vocab,
        width=args.width,
        batch=args.batch,
        ids_per_sample=args.ids_per_sample,
        permitted_fraction=args.permitted_fraction,
        steps=args.steps,
        baseline_steps=args.baseline_steps,
        warmup=args.warmup,
        scaling_vocabs=args.scaling_vocabs,
        variants=args.variants,
        seed=args.seed,
        update_only_steps=args.update_only_steps,
    )


if __name__ == "__main__":
    main()
