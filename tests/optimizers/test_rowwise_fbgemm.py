"""RowwiseAdagrad against FBGEMM's CPU ``EXACT_ROWWISE_ADAGRAD`` (issue #44).

FBGEMM's CPU rule (``rowwise_adagrad``'s ``split_weight_update_cpu`` in its
``codegen/genscript/optimizers.py``), for each row ``r`` of a batch after its
duplicate ids' gradients are summed (``weight_decay_mode`` NONE, so its
``correction`` is 1)::

    G_r += (sum_d g_rd * g_rd) / D        # float32, d in order
    multiplier = lr / (sqrtf(G_r) + eps)  # epsilon outside the root
    w_rd = 1.0 * w_rd - g_rd * multiplier

Ours (``RowwiseAdagrad.row_update``): ``G_r += mean_d(g_rd^2)``,
``w_r -= (lr * g_r) / (sqrt(G_r) + eps)``: the same rule, rounded in another
order. Both run 20 steps on the same float32 table, ids (duplicates in every
batch) and upstream gradients, alone on a variable and inside
``MaskedOptimizer`` on a ``PartialEmbedding`` with every row permitted.

The bound (see ``_reference``). The gradients are multiples of 2**-6 below
0.5 in size, ids repeat at most three times a batch, D = 32, and a row's
accumulator is a sum of at most 20 steps' means: every duplicate sum, square,
row sum (in any order), mean and accumulator is then a float32 number with
fewer than 24 significant bits, so exact on both sides, and the accumulators
must match bit for bit. What is left is rounded: ``sqrt`` and ``+ eps``
(correctly rounded, IEEE, on both sides, so equal), ours one quotient (``lr *
g`` is exact: lr is a power of two), theirs ``lr / r`` and ``g * multiplier``:
at most 3 units of roundoff ``u = 2**-24`` of the decrement between the two
(first order). Each side then rounds ``w - decrement`` (half an ulp each). As
the upstream gradients do not depend on the table, the two tables' difference
after step T is at most ``sum_t (3u |decrement_t| + ulp(w_t))`` per element,
``ulp(x) <= 2u |x|``: a few ulps per step, relative to the magnitudes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import as_numpy, assert_bits_equal

torch = pytest.importorskip("torch")
tbe_training = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
tbe_common = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_common")
fbgemm_configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("on_cpu")]

ROWS, WIDTH, STEPS = 64, 32, 20
#: The last rows, in no batch: they must keep their bits on both sides.
COLD_ROWS = 4
#: Exact in float32 on both sides (FBGEMM keeps it in a float tensor).
LEARNING_RATE = 0.25
#: Large enough that inside the root it would give another table.
EPSILON = 0.125
UNIT_ROUNDOFF = 2.0**-24


def _batches(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """``STEPS`` batches of 48 ids (24 rows but the cold ones: 8 thrice, 8
    twice, 8 once) and their upstream gradients, integers in [-31, 31] times
    2**-6."""
    batches = []
    for _ in range(STEPS):
        rows = rng.choice(ROWS - COLD_ROWS, 24, replace=False)
        ids = rng.permutation(np.concatenate([rows, rows[:16], rows[:8]]))
        gradient = rng.integers(-31, 32, (ids.size, WIDTH)) * 2.0**-6
        batches.append((ids.astype(np.int64), gradient.astype(np.float32)))
    return batches


def _reference(
    initial: np.ndarray, batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The accumulators in float64 and the bound (module docstring) on the
    two float32 tables' difference, per element."""
    table = initial.astype(np.float64)
    accumulator = np.zeros(ROWS)
    bound = np.zeros_like(table)
    for ids, gradient in batches:
        summed = np.zeros_like(table)
        np.add.at(summed, ids, gradient.astype(np.float64))
        rows = np.unique(ids)
        accumulator[rows] += np.mean(summed[rows] ** 2, axis=1)
        root = np.sqrt(accumulator[rows]) + EPSILON
        decrement = LEARNING_RATE * summed[rows] / root[:, None]
        table[rows] -= decrement
        # 2u|w| is an ulp of w; 2**-10 more covers the float32 tables' own
        # distance from this float64 one (far below it).
        ulp = 2 * UNIT_ROUNDOFF * np.abs(table[rows]) * (1 + 2.0**-10)
        bound[rows] += 3 * UNIT_ROUNDOFF * np.abs(decrement) + ulp
    return accumulator, bound


def _fbgemm(
    initial: np.ndarray, batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """FBGEMM's table and accumulators after the batches (one id per bag,
    summed: each id's gradient is its upstream row)."""
    tbe = tbe_training.SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, WIDTH, tbe_common.EmbeddingLocation.HOST, tbe_training.ComputeDevice.CPU)],
        optimizer=fbgemm_configs.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=LEARNING_RATE,
        eps=EPSILON,
        weight_decay=0.0,
        weight_decay_mode=tbe_training.WeightDecayMode.NONE,
        pooling_mode=tbe_common.PoolingMode.SUM,
    )
    with torch.no_grad():
        tbe.split_embedding_weights()[0].copy_(torch.from_numpy(initial))
    for ids, gradient in batches:
        offsets = torch.arange(ids.size + 1, dtype=torch.int64)
        tbe(torch.from_numpy(ids), offsets).backward(torch.from_numpy(gradient))
    table = tbe.split_embedding_weights()[0].detach().numpy().copy()
    (accumulator,) = tbe.split_optimizer_states()[0]
    return table, accumulator.detach().numpy().copy()


def _alone(
    initial: np.ndarray, batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """``RowwiseAdagrad`` alone on a variable, fed each batch as IndexedSlices."""
    table = tf.Variable(initial)
    optimizer = pe.RowwiseAdagrad(learning_rate=LEARNING_RATE, epsilon=EPSILON)
    optimizer.build([table])
    for ids, gradient in batches:
        slices = tf.IndexedSlices(tf.constant(gradient), tf.constant(ids), [ROWS, WIDTH])
        optimizer.apply([slices], [table])
    return table.numpy(), optimizer._accumulators[0].numpy()


def _masked(
    initial: np.ndarray, batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """``MaskedOptimizer(RowwiseAdagrad)`` on a ``PartialEmbedding`` with
    every row permitted, the gradient taken through its lookup, in a
    ``tf.function``."""
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=initial, trainable_ids=np.ones(ROWS, bool))
    layer.build((None,))
    table = layer.embeddings
    optimizer = pe.MaskedOptimizer(pe.RowwiseAdagrad(learning_rate=LEARNING_RATE, epsilon=EPSILON))
    optimizer.build([table])

    @tf.function
    def step(ids: tf.Tensor, upstream: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            rows = layer(ids, training=True)
        optimizer.apply(tape.gradient(rows, [table], output_gradients=upstream), [table])

    for ids, gradient in batches:
        step(tf.constant(ids), tf.constant(gradient))
    accumulator = optimizer.slot_rows(table, "accumulator", np.arange(ROWS))
    return as_numpy(table), np.asarray(accumulator)


OURS: dict[str, Any] = {"alone": _alone, "masked": _masked}


@pytest.mark.parametrize("ours", sorted(OURS))
def test_rowwise_adagrad_equals_fbgemm_exact_rowwise_adagrad(ours, rng):
    initial = rng.uniform(-1.0, 1.0, (ROWS, WIDTH)).astype(np.float32)
    batches = _batches(rng)
    expected_accumulator, bound = _reference(initial, batches)
    their_table, their_accumulator = _fbgemm(initial, batches)
    our_table, our_accumulator = OURS[ours](initial, batches)

    # Exact on both sides (module docstring): bit for bit, and equal to float64.
    assert_bits_equal(our_accumulator, their_accumulator, "accumulators, ours vs FBGEMM")
    assert_bits_equal(their_accumulator, expected_accumulator, "FBGEMM's vs float64")
    cold = slice(ROWS - COLD_ROWS, ROWS)
    assert_bits_equal(our_table[cold], initial[cold], "rows never in a batch")
    assert_bits_equal(their_table[cold], initial[cold], "FBGEMM's rows never in a batch")

    difference = np.abs(our_table.astype(np.float64) - their_table)
    worst = np.unravel_index(np.argmax(difference - bound), difference.shape)
    assert np.all(difference <= bound), (
        f"ours and FBGEMM's tables differ by {difference[worst]:.3g} at {list(worst)}, "
        f"over the bound {bound[worst]:.3g}"
    )
