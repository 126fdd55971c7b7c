"""The models the benchmarks share: one pooled-embedding model, built each way.

``build_variant`` returns a compiled training step and the objects it keeps
alive for each variant the training benchmark times: ``PartialEmbedding`` +
``MaskedOptimizer`` around a rule of ``RULES`` (Adam unless told
another; compact slots, full-size slots, under XLA), stock
``keras.layers.Embedding`` + the same rule, the dense-mask workaround, and
lazy masked Adam written with stock TensorFlow ops only (``stock_tf_step``).
The memory benchmark builds its models from the same functions, and its int8 layers
(frozen rows in int8, one scale per row) with ``int8_embedding``; what each
variable holds (``variable_bytes``, ``allocator_figures``) and whether a
sample of frozen int8 rows kept its bytes (``FrozenSample``) are measured here
too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer, RowwiseAdagrad, RowwiseAdam  # noqa: E402

# -- the update rules the training benchmarks take: ``--optimizer NAME`` -------
#
# ``RULES`` names a factory of a fresh Keras optimizer for every rule that
# ``MaskedOptimizer`` has a fused kernel for; the per-id training step, the bag
# model and the rule-quality test build the optimizers of their Keras-optimizer
# variants here (the floors' heads and the lazy Adam written out by hand keep
# Adam). ``adam`` (``Adam(1e-3)``) is the default.
#
# The learning rates are each rule's usual order for an embedding: the
# adaptive rules at Keras' 1e-3, the Adagrad rules at 0.1 (Keras' Adagrad
# starts its accumulator at 0.1, so its first steps are about ``lr * |g| /
# 0.32``; ``RowwiseAdagrad`` starts it at FBGEMM's 0, so its first step moves
# each element of a row by about ``lr``), plain SGD at 0.1 and SGD with
# momentum 0.9 at 0.01 (the same step in the long run). At 0.5, plain SGD's
# steps of the head's bias overshot from one batch to the next and raised the
# bag model's loss on some seeds (tests/optimizers/test_rule_quality.py). A
# step's time does not depend on them.

#: Each rule's name on the command line and a factory of a fresh optimizer.
RULES: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(1e-3),
    "rmsprop_momentum": lambda: keras.optimizers.RMSprop(1e-3, momentum=0.9),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(1e-3, centered=True),
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "adamw": lambda: keras.optimizers.AdamW(1e-3),
    "amsgrad": lambda: keras.optimizers.Adam(1e-3, amsgrad=True),
    "rowwise_adagrad": lambda: RowwiseAdagrad(0.1),
    "rowwise_adam": lambda: RowwiseAdam(1e-3),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=1e-3),
}

#: The rule the benchmarks use unless told another.
DEFAULT_RULE = "adam"


def make_optimizer(rule: str) -> keras.optimizers.Optimizer:
    """A fresh optimizer of ``rule`` (one of ``RULES``).

    Raises:
      ValueError: ``rule`` is not one of ``RULES``.
    """
    if rule not in RULES:
        raise ValueError(f"unknown optimizer {rule!r}; choose from {', '.join(RULES)}")
    return RULES[rule]()


def adam_only_note(rule: str, left_out: Sequence[str]) -> str:
    """The line that says ``left_out``, lazy Adam written out by hand, is not
    timed under ``rule``.

    >>> adam_only_note("sgd", ["stock_tf", "the bare_loop floor"])
    '--optimizer sgd: stock_tf and the bare_loop floor are lazy Adam written out by hand; left out'
    """
    names = ", ".join(left_out[:-1]) + " and " + left_out[-1] if len(left_out) > 1 else left_out[0]
    verb = "are" if len(left_out) > 1 else "is"
    return f"--optimizer {rule}: {names} {verb} lazy Adam written out by hand; left out"


#: The memory benchmark's variants whose frozen rows are int8.
INT8_VARIANTS = ("int8_quantize", "int8_mmap", "int8_init")

#: Every model the training benchmark knows, by the name its tables use.
VARIANTS = ("partial", "partial_xla", "partial_full_slots", "keras", "dense_mask", "stock_tf")


# -- models ------------------------------------------------------------------


class DenseMaskEmbedding(keras.layers.Layer):
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


def pooled_model(embedding: keras.layers.Layer, ids_per_sample: int) -> keras.Model:
    inputs = keras.Input((ids_per_sample,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(embedding(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(pooled))


def keras_step(
    model: keras.Model, optimizer: keras.optimizers.Optimizer, jit_compile: bool = False
) -> Callable:
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function(jit_compile=jit_compile)
    def step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True) - targets))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def stock_tf_update(
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


def stock_tf_tables(
    vocab: int, width: int, permitted: np.ndarray
) -> tuple[tuple[tf.Variable, tf.Variable, tf.Variable], tf.Variable, tf.Variable]:
    table = tf.Variable(tf.random.uniform([vocab, width], -0.05, 0.05))
    first = tf.Variable(tf.zeros([vocab, width]))
    second = tf.Variable(tf.zeros([vocab, width]))
    return (table, first, second), tf.Variable(permitted), tf.Variable(0, dtype=tf.int64)


def _mean_of_rows(table: tf.Variable, ids: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)  # ResourceGather


def stock_tf_step(
    vocab: int,
    width: int,
    permitted: np.ndarray,
    ids_per_sample: int = 0,
    lr: float = 1e-3,
    pool: Callable[[tf.Variable, Any], tf.Tensor] = _mean_of_rows,
) -> tuple[Callable, list[Any]]:
    """Lazy masked Adam with stock TF ops only (variables in plain tf.Variable):
    ``pool(table, ids)`` (the mean of each sample's rows unless given) into a
    ``Dense(1)`` with Keras' ``Adam``, MSE, and ``stock_tf_update`` on the table."""
    tables, mask, step_count = stock_tf_tables(vocab, width, permitted)
    table = tables[0]
    head = keras.layers.Dense(1)
    head.build((None, width))
    head_optimizer = keras.optimizers.Adam(lr)
    head_optimizer.build(head.trainable_variables)

    @tf.function
    def step(ids: Any, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            prediction = head(pool(table, ids))
            loss = tf.reduce_mean(tf.square(prediction - targets))
        table_grad, *head_grads = tape.gradient(loss, [table, *head.trainable_variables])
        head_optimizer.apply(head_grads, head.trainable_variables)
        stock_tf_update(tables, mask, step_count, table_grad, lr)
        return loss

    return step, [*tables, mask, step_count, head, head_optimizer]


def build_variant(
    variant: str,
    vocab: int,
    width: int,
    permitted: np.ndarray,
    ids_per_sample: int,
    rule: str = DEFAULT_RULE,
) -> tuple[Callable, list[Any]]:
    """A training step of the pooled model built as ``variant`` says, with
    ``rule`` (one of ``RULES``) as its optimizer, and the
    objects the step keeps alive.

    Raises:
      ValueError: An unknown variant, or ``stock_tf`` (lazy Adam written
        with stock ops) with a rule other than ``adam``.
    """
    if variant == "stock_tf":
        if rule != "adam":
            raise ValueError(f"stock_tf implements lazy Adam only, not {rule!r}")
        return stock_tf_step(vocab, width, permitted, ids_per_sample)
    if variant in ("partial", "partial_xla", "partial_full_slots"):
        embedding = PartialEmbedding(vocab, width, trainable_ids=permitted)
        optimizer = MaskedOptimizer(
            make_optimizer(rule), compact_slots=variant != "partial_full_slots"
        )
    elif variant == "keras":
        embedding = keras.layers.Embedding(vocab, width)
        optimizer = make_optimizer(rule)
    elif variant == "dense_mask":
        embedding = DenseMaskEmbedding(vocab, width, ~permitted)
        optimizer = make_optimizer(rule)
    else:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    model = pooled_model(embedding, ids_per_sample)
    return keras_step(model, optimizer, variant == "partial_xla"), [model, optimizer]


# -- int8 frozen rows: the layers and what they hold ----------------------------


FROZEN_SAMPLE_ROWS = 4096


def int8_embedding(
    variant: str, vocab: int, width: int, permitted: np.ndarray, weights: Any
) -> Any:
    """A quantized ``PartialEmbedding`` built as ``variant`` says.

    Args:
      variant: One of ``INT8_VARIANTS``.
      vocab, width: The table's shape.
      permitted: The rows that train (sorted ids).
      weights: The float table for ``int8_mmap`` (an array or a memory-mapped
        ``.npy``); ignored otherwise.

    Raises:
      ValueError: an unknown variant, or ``int8_mmap`` without weights.
    """
    from partial_embedding.layers import PartialEmbedding

    if variant == "int8_quantize":
        layer = PartialEmbedding(vocab, width, trainable_ids=permitted)
        layer.build()
        layer.quantize("int8")
        return layer
    if variant == "int8_mmap":
        if weights is None:
            raise ValueError("variant: 'int8_mmap' needs the float weights")
        return PartialEmbedding(
            vocab, width, weights=weights, trainable_ids=permitted, dtype="int8_from_float32"
        )
    if variant == "int8_init":
        return PartialEmbedding(vocab, width, trainable_ids=permitted, dtype="int8_from_float32")
    raise ValueError(f"variant: unknown {variant!r}; choose from {INT8_VARIANTS}")


def variable_bytes(variables: Sequence[Any]) -> dict[str, int]:
    """Bytes each variable holds now, by its path (or name), without reading it."""
    import tensorflow as tf

    figures: dict[str, int] = {}
    for variable in {id(v): v for v in variables}.values():
        name = getattr(variable, "path", None) or variable.name
        figures[name] = int(tf.size(variable)) * tf.as_dtype(variable.dtype).size
    return figures


def allocator_figures() -> dict[str, int]:
    """What the allocators hold: TensorFlow's CPU pool (bytes in use now and
    at most, where it keeps statistics) and glibc's heap (``mallinfo2``: in
    use, free but kept, and in ``mmap`` blocks), where available."""
    import ctypes

    import tensorflow as tf

    figures: dict[str, int] = {}
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
        figures.update(tf_current=int(info["current"]), tf_peak=int(info["peak"]))
    except (ValueError, tf.errors.OpError, RuntimeError):
        pass

    class _MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                "fsmblks", "uordblks", "fordblks", "keepcost",
            )
        ]  # fmt: skip

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        heap = libc.mallinfo2()
    except (OSError, AttributeError):
        return figures
    figures.update(
        malloc_in_use=int(heap.uordblks),
        malloc_free=int(heap.fordblks),
        malloc_mmap=int(heap.hblkhd),
    )
    return figures


class FrozenSample:
    """A copy of some frozen rows' int8 bytes and scales, to compare later."""

    def __init__(self, layer: Any, count: int = FROZEN_SAMPLE_ROWS, seed: int = 0) -> None:
        frozen = ~np.asarray(layer.trainable_mask.numpy(), bool)
        candidates = np.flatnonzero(frozen)
        rng = np.random.default_rng([seed, 2])
        size = min(count, len(candidates))
        self.ids = np.sort(rng.choice(candidates, size=size, replace=False)).astype(np.int64)
        self.layer = layer
        self.codes, self.scales = self._read()

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        import tensorflow as tf

        ids = tf.constant(self.ids)
        codes = np.array(tf.gather(self.layer.embeddings, ids).numpy())
        scales = np.array(tf.gather(self.layer.embeddings_scale, ids).numpy())
        return codes, scales

    def unchanged(self) -> bool:
        """Whether every sampled row's int8 bytes and scale bits are as copied."""
        codes, scales = self._read()
        same_scales = scales.view(np.uint8).tobytes() == self.scales.view(np.uint8).tobytes()
        return bool(np.array_equal(codes, self.codes)) and same_scales
