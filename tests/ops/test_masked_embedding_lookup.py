"""Tests of masked_embedding_lookup and entry_stop_gradients.

Random inputs come from ``make_rng`` with the test's id: fixed by default,
printed on failure, replayed with PE_TEST_SEED=<int>, fresh with
PE_TEST_SEED=random.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import partial_embedding as pe
from pe_testing import INDEX_DTYPES, VALUE_DTYPES, make_rng

MODES = ["eager", "function"]
DTYPE_INDEX_MODE = [
    dict(
        testcase_name=f"_{dtype.name}_{index_dtype.name}_{mode}",
        dtype=dtype,
        index_dtype=index_dtype,
        mode=mode,
    )
    for dtype in VALUE_DTYPES
    for index_dtype in INDEX_DTYPES
    for mode in MODES
]


def random_problem(rng, num_rows, width, ids_shape, dtype, index_dtype):
    table = rng.standard_normal([num_rows, width]).astype(dtype.as_numpy_dtype)
    ids = rng.integers(0, num_rows, size=ids_shape).astype(index_dtype.as_numpy_dtype)
    row_mask = rng.random(num_rows) < 0.5
    # Make sure both kinds of rows occur among the ids.
    flat = ids.reshape(-1)
    row_mask[flat[0]] = True
    row_mask[flat[-1]] = False
    return table, ids, row_mask


def sum_gradient(variable, ids, row_mask) -> tf.IndexedSlices:
    """The gradient of the sum of the looked-up rows, with respect to the table."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(pe.masked_embedding_lookup(variable, ids, row_mask))
    return tape.gradient(loss, variable)


def run(mode, fn, *args):
    if mode == "function":
        return tf.function(fn, autograph=False)(*args)
    return fn(*args)


class MaskedEmbeddingLookupTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(*DTYPE_INDEX_MODE)
    def test_values_equal_gather(self, dtype, index_dtype, mode):
        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 11, 3, [4, 5], dtype, index_dtype)
        variable = tf.Variable(table)

        def lookup(ids_tensor):
            return pe.masked_embedding_lookup(variable, ids_tensor, row_mask)

        shapes = (ids, ids[0], ids[0, 0], ids[:0]) if mode == "eager" else (ids, ids[0, 0])
        for ids_value in shapes:
            result = run(mode, lookup, tf.constant(ids_value))
            expected = tf.gather(table, ids_value)
            self.assertEqual(result.dtype, dtype)
            self.assertEqual(result.shape, ids_value.shape + (3,))
            # Bit for bit: compare the raw bytes.
            self.assertAllEqual(
                np.asarray(result).view(np.uint8), np.asarray(expected).view(np.uint8)
            )

    @parameterized.named_parameters(*DTYPE_INDEX_MODE)
    def test_gradient_holds_only_permitted_occurrences(self, dtype, index_dtype, mode):
        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 9, 2, [3, 4], dtype, index_dtype)
        upstream = rng.standard_normal(ids.shape + (2,)).astype(dtype.as_numpy_dtype)
        variable = tf.Variable(table)

        def gradients(ids_tensor):
            with tf.GradientTape(persistent=True) as tape:
                masked = pe.masked_embedding_lookup(variable, ids_tensor, row_mask)
                loss_masked = tf.reduce_sum(masked * upstream)
                plain = tf.gather(variable, ids_tensor)
                loss_plain = tf.reduce_sum(plain * upstream)
            return tape.gradient(loss_masked, variable), tape.gradient(loss_plain, variable)

        grad, plain_grad = run(mode, gradients, tf.constant(ids))
        self.assertIsInstance(grad, tf.IndexedSlices)
        self.assertAllEqual(grad.dense_shape, table.shape)
        flat_ids = ids.reshape(-1)
        permitted_positions = np.flatnonzero(row_mask[flat_ids])
        self.assertAllEqual(grad.indices, flat_ids[permitted_positions])
        # The same values as tf.gather's gradient on those occurrences.
        self.assertAllEqual(grad.values, tf.gather(plain_grad.values, permitted_positions))
        self.assertAllEqual(grad.values, upstream.reshape(-1, 2)[permitted_positions])
        self.assertNotIn(False, row_mask[np.asarray(grad.indices)])

    @parameterized.named_parameters(("_int32", tf.int32), ("_int64", tf.int64))
    def test_gradient_matches_numeric_jacobian_on_permitted_rows(self, index_dtype):
        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 5, 2, [4], tf.float64, index_dtype)
        variable = tf.Variable(table)

        def lookup_of(table_value):
            variable.assign(table_value)
            return pe.masked_embedding_lookup(variable, ids, row_mask)

        # Numeric Jacobian of the op's own forward pass (perturbing the table).
        _, (numeric,) = tf.test.compute_gradient(lookup_of, [tf.constant(table)])
        numeric = numeric.T  # [table entries, output entries]
        variable.assign(table)
        # The Jacobian from the op's gradient, one output entry at a time.
        theoretical = np.zeros_like(numeric)
        for output_index in range(numeric.shape[1]):
            upstream = np.zeros(numeric.shape[1])
            upstream[output_index] = 1.0
            with tf.GradientTape() as tape:
                output = pe.masked_embedding_lookup(variable, ids, row_mask)
                loss = tf.reduce_sum(tf.reshape(output, [-1]) * upstream)
            grad = tf.convert_to_tensor(tape.gradient(loss, variable))
            theoretical[:, output_index] = np.asarray(grad).reshape(-1)
        entry_permitted = np.repeat(row_mask, 2)
        self.assertAllClose(theoretical[entry_permitted], numeric[entry_permitted], atol=1e-6)
        self.assertAllEqual(
            theoretical[~entry_permitted], np.zeros_like(theoretical[~entry_permitted])
        )
        # The forward pass does depend on the frozen rows the ids touch.
        touched_frozen = np.repeat(np.isin(np.arange(5), ids) & ~row_mask, 2)
        self.assertTrue(np.all(np.abs(numeric[touched_frozen]).sum(axis=1) > 0))

    def test_mask_variable_change_applies_without_retracing(self):
        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 8, 2, [6], tf.float32, tf.int32)
        variable = tf.Variable(table)
        mask_variable = tf.Variable(row_mask)

        @tf.function
        def gradient_indices(ids_tensor):
            return sum_gradient(variable, ids_tensor, mask_variable).indices

        for _ in range(3):
            new_mask = rng.random(8) < 0.5
            mask_variable.assign(new_mask)
            self.assertAllEqual(gradient_indices(tf.constant(ids)), ids[new_mask[ids]])
        self.assertEqual(gradient_indices.experimental_get_tracing_count(), 1)

    def test_keras_variables_are_accepted(self):
        import keras

        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 7, 3, [5], tf.float32, tf.int64)
        params = keras.Variable(table)
        mask = keras.Variable(row_mask, dtype="bool", trainable=False)
        with tf.GradientTape() as tape:
            output = pe.masked_embedding_lookup(params, ids, mask)
            loss = tf.reduce_sum(output)
        self.assertAllEqual(output, table[ids])
        grad = tape.gradient(loss, params.value)
        self.assertAllEqual(grad.indices, ids[row_mask[ids]])

    def test_gradient_tape_sgd_loop_keeps_frozen_rows(self):
        rng = make_rng(self.id())
        table, ids, row_mask = random_problem(rng, 12, 4, [10], tf.float32, tf.int32)
        variable = tf.Variable(table)
        for _ in range(3):
            with tf.GradientTape() as tape:
                output = pe.masked_embedding_lookup(variable, ids, row_mask)
                loss = tf.reduce_sum(tf.square(output - 1.0))
            grad = tape.gradient(loss, variable)
            variable.scatter_sub(tf.IndexedSlices(0.1 * grad.values, grad.indices))
        after = variable.numpy()
        frozen = ~row_mask
        self.assertAllEqual(after[frozen], table[frozen])
        moved = row_mask & np.isin(np.arange(12), ids)
        self.assertTrue(np.all(np.any(after[moved] != table[moved], axis=1)))

    def test_no_vocabulary_sized_tensor_and_no_copy_on_read(self):
        num_rows = 100_003  # A size no other tensor here has.
        variable = tf.Variable(tf.zeros([num_rows, 2]))
        mask_variable = tf.Variable(tf.zeros([num_rows], tf.bool))

        @tf.function
        def step(ids_tensor):
            return sum_gradient(variable, ids_tensor, mask_variable).values

        graph = step.get_concrete_function(tf.TensorSpec([None], tf.int32)).graph
        op_types = {op.type for op in graph.get_operations()}
        # ResourceGather would switch the variables into copy-on-read mode,
        # after which every full read copies the whole table.
        self.assertNotIn("ResourceGather", op_types)
        self.assertIn("GatherV2", op_types)
        for op in graph.get_operations():
            for output in op.outputs:
                dims = output.shape.as_list() if output.shape.rank is not None else []
                # Ops nothing consumes are pruned before a function runs.
                if num_rows in dims and output.consumers():
                    # Only the reads themselves, which alias the variables'
                    # buffers, and identities passing them on (the custom
                    # gradient's IdentityN): nothing vocabulary-sized is computed.
                    self.assertIn(
                        op.type, ("ReadVariableOp", "IdentityN"), msg=f"{op.type} {op.name}"
                    )

    @parameterized.named_parameters(("_eager", "eager"), ("_function", "function"))
    def test_out_of_range_ids_raise(self, mode):
        variable = tf.Variable(tf.ones([4, 2]))
        for bad_ids in ([0, 4], [-1, 2], [[1, 2], [3, 100]]):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"ids must be in \[0, V\)"):
                run(
                    mode,
                    lambda ids_tensor: pe.masked_embedding_lookup(
                        variable, ids_tensor, [True, False, True, True]
                    ),
                    tf.constant(bad_ids),
                )
        self.assertAllEqual(variable, np.ones([4, 2]))

    def test_bad_arguments_raise_before_running(self):
        variable = tf.Variable(tf.ones([4, 2]))
        mask = [True, False, True, True]
        cases = [
            (tf.ones([4, 2]), [0], mask, pe.PartialEmbeddingTypeError, "params"),
            (
                tf.Variable(tf.ones([4, 2], tf.int32)),
                [0],
                mask,
                pe.PartialEmbeddingTypeError,
                "params: dtype int32",
            ),
            (variable, [0.5], mask, pe.PartialEmbeddingTypeError, "ids: dtype float"),
            (
                variable,
                [0],
                [True, False],
                pe.PartialEmbeddingArgumentError,
                r"row_mask: shape \(2,\) must be \[4\]",
            ),
            (
                variable,
                [0],
                [[True] * 4],
                pe.PartialEmbeddingArgumentError,
                "row_mask: shape .*rank 1",
            ),
            (
                variable,
                [0],
                [1, 0, 1, 1],
                pe.PartialEmbeddingTypeError,
                "row_mask: dtype int64 must be bool",
            ),
        ]
        for params, ids, row_mask, error, pattern in cases:
            with self.assertRaisesRegex(error, pattern):
                pe.masked_embedding_lookup(params, ids, row_mask)
        # Argument errors are ValueErrors too.
        with self.assertRaises(ValueError):
            pe.masked_embedding_lookup(variable, [0], [True])
        self.assertAllEqual(variable, np.ones([4, 2]))

    def test_under_xla_out_of_range_ids_give_zero_rows_and_no_gradient(self):
        variable = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))
        mask = [True, False, True, True]

        @tf.function(jit_compile=True)
        def lookup(ids):
            with tf.GradientTape() as tape:
                rows = pe.masked_embedding_lookup(variable, ids, mask)
                loss = tf.reduce_sum(rows * rows)
            gradient = tape.gradient(loss, variable)
            return rows, tf.convert_to_tensor(gradient)

        rows, gradient = lookup(tf.constant([2, -1, 4, 1, 2]))
        table = np.arange(8, dtype=np.float32).reshape(4, 2)
        self.assertAllEqual(rows, [table[2], [0, 0], [0, 0], table[1], table[2]])
        # Row 2 twice (2 * 2 * value); frozen row 1 and the bad ids: nothing.
        self.assertAllEqual(gradient, [[0, 0], [0, 0], 4 * table[2], [0, 0]])


V1_OPTIMIZERS = {
    "GradientDescent": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "Momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    "Adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "Adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
}


class V1GraphOptimizerTest(tf.test.TestCase, parameterized.TestCase):
    """The classic TF1 setting: a graph, a session, tf.compat.v1.train."""

    @parameterized.named_parameters(
        dict(
            testcase_name=f"_{name}_{how}_{dtype.name}_{index_dtype.name}",
            optimizer_name=name,
            how=how,
            dtype=dtype,
            index_dtype=index_dtype,
        )
        for name in V1_OPTIMIZERS
        for how, dtype, index_dtype in (
            ("compute_apply", tf.float32, tf.int64),
            ("minimize", tf.float64, tf.int32),
        )
    )
    def test_frozen_rows_bit_exact_permitted_rows_move(
        self, optimizer_name, how, dtype, index_dtype
    ):
        rng = make_rng(self.id())
        num_rows, width = 10, 3
        table = rng.standard_normal([num_rows, width]).astype(dtype.as_numpy_dtype)
        graph = tf.Graph()
        with graph.as_default():
            variable = tf.compat.v1.get_variable("embeddings", initializer=table, use_resource=True)
            mask = tf.compat.v1.get_variable(
                "row_mask",
                initializer=np.zeros(num_rows, dtype=bool),
                use_resource=True,
                trainable=False,
            )
            ids = tf.compat.v1.placeholder(index_dtype, [None])
            targets = tf.compat.v1.placeholder(dtype, [None, width])
            output = pe.masked_embedding_lookup(variable, ids, mask)
            loss = tf.reduce_sum(tf.square(output - targets))
            optimizer = V1_OPTIMIZERS[optimizer_name]()
            if how == "minimize":
                train_op = optimizer.minimize(loss)
            else:
                grads_and_vars = optimizer.compute_gradients(loss, [variable])
                ((grad, _),) = grads_and_vars
                self.assertIsInstance(grad, tf.IndexedSlices)
                train_op = optimizer.apply_gradients(grads_and_vars)
            new_mask = tf.compat.v1.placeholder(tf.bool, [num_rows])
            assign_mask = mask.assign(new_mask)
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            row_mask = rng.random(num_rows) < 0.5
            row_mask[:2] = [True, False]
            session.run(assign_mask, {new_mask: row_mask})
            batches = []
            for _ in range(4):
                batch = rng.integers(0, num_rows, size=8)
                batch[:2] = [0, 1]  # a permitted and a frozen row, every step
                batches.append(batch)
                session.run(
                    train_op,
                    {ids: batch, targets: rng.standard_normal([8, width])},
                )
            after = session.run(variable)
        touched = np.isin(np.arange(num_rows), np.concatenate(batches))
        self.assertAllEqual(after[~row_mask], table[~row_mask])
        moved = row_mask & touched
        self.assertTrue(np.all(np.any(after[moved] != table[moved], axis=1)))

    def test_mask_change_in_session_applies_next_run(self):
        rng = make_rng(self.id())
        table = rng.standard_normal([6, 2]).astype(np.float32)
        graph = tf.Graph()
        with graph.as_default():
            variable = tf.compat.v1.get_variable("embeddings", initializer=table, use_resource=True)
            mask = tf.compat.v1.placeholder(tf.bool, [6])
            loss = tf.reduce_sum(pe.masked_embedding_lookup(variable, tf.range(6), mask))
            train_op = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            first = np.array([True, True, True, False, False, False])
            session.run(train_op, {mask: first})
            session.run(train_op, {mask: ~first})
            after = session.run(variable)
        self.assertAllEqual(after, table - 1.0)


class EntryStopGradientsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("_float16", tf.float16), ("_float32", tf.float32), ("_float64", tf.float64)
    )
    def test_forward_unchanged_gradient_only_where_mask(self, dtype):
        rng = make_rng(self.id())
        target_value = rng.standard_normal([5, 3]).astype(dtype.as_numpy_dtype)
        target_value[0, 0] = np.inf
        row_mask = rng.random([5, 1]) < 0.5
        upstream = rng.standard_normal([5, 3]).astype(dtype.as_numpy_dtype)
        target = tf.constant(target_value)
        with tf.GradientTape() as tape:
            tape.watch(target)
            result = pe.entry_stop_gradients(target, row_mask)
            loss = tf.reduce_sum(tf.where(tf.math.is_finite(result), result, 0.0) * upstream)
        self.assertAllEqual(np.asarray(result).view(np.uint8), target_value.view(np.uint8))
        grad = tape.gradient(loss, target).numpy()
        expected = np.where(row_mask, upstream, 0).astype(dtype.as_numpy_dtype)
        expected[0, 0] = 0  # the inf entry is cut off by the loss above
        self.assertAllEqual(grad, expected)

    def test_numeric_mask(self):
        target = tf.constant([1.0, 2.0, 3.0])
        with tf.GradientTape() as tape:
            tape.watch(target)
            loss = tf.reduce_sum(pe.entry_stop_gradients(target, [0.0, 2.0, 0.0]))
        self.assertAllEqual(tape.gradient(loss, target), [0.0, 1.0, 0.0])


if __name__ == "__main__":
    tf.test.main()
