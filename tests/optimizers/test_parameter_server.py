"""MaskedOptimizer on ShardedVariable tables (ParameterServerStrategy).

In this process: every rule on a table split into shards (as a
``variable_partitioner`` splits it) against the same rule on one variable.
On a real cluster: ``python -m partial_embedding.examples.parameter_server``
(2 parameter servers, 2 workers, each a process on the loopback address),
with a worker killed mid-training, then a checkpoint restored on a
restarted cluster, against the same training on one machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.examples import parameter_server as example
from pe_testing import assert_bits_equal, case_seed, sharding_creator

VOCAB = 10
WIDTH = 3
#: Uneven shards, as FixedShardsPartitioner makes for 10 rows in 3.
SHARD_ROWS = (4, 3, 3)
CLUSTER_TIMEOUT_S = 240


_sharding_creator = sharding_creator(VOCAB, SHARD_ROWS)


def _train(inner, compact, sharded, table, permitted, batches):
    """Three steps of MaskedOptimizer(inner) on a (sharded) table."""
    creator = _sharding_creator if sharded else (lambda next_creator, **kw: next_creator(**kw))
    with tf.variable_creator_scope(creator):
        weights = keras.Variable(table, name="table")
        mask = keras.Variable(permitted, trainable=False, name="mask")
    optimizer = pe.MaskedOptimizer(inner, row_masks=[(weights, mask)], compact_slots=compact)
    optimizer.build([weights])
    sources = optimizer.gradient_sources([weights])
    for ids in batches:
        with tf.GradientTape() as tape:
            rows = pe.masked_embedding_lookup(weights, ids, mask)
            loss = tf.reduce_sum(tf.square(rows - 1.0))
        optimizer.apply(tape.gradient(loss, sources), [weights])
    return weights, optimizer


RULES = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.1, amsgrad=True),
    "adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.05),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.1, momentum=0.5, centered=True),
    "rowwise_adagrad": lambda: pe.RowwiseAdagrad(0.1, initial_accumulator_value=0.1),
    "rowwise_adam": lambda: pe.RowwiseAdam(0.1, weight_decay=0.05),
}


@pytest.mark.parametrize("compact", [False, True], ids=["full_slots", "compact_slots"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_on_a_sharded_table_matches_one_variable(rule, compact, rng):
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    permitted = np.zeros(VOCAB, bool)
    permitted[[0, 2, 3, 5, 9]] = True
    batches = [rng.integers(0, VOCAB, size=6) for _ in range(3)]
    weights, optimizer = _train(RULES[rule](), compact, True, table, permitted, batches)
    reference, reference_optimizer = _train(
        RULES[rule](), compact, False, table, permitted, batches
    )
    shards = weights.value.variables
    assert [int(s.shape[0]) for s in shards] == list(SHARD_ROWS)
    trained = np.concatenate([s.numpy() for s in shards])
    start = 0
    for index, rows in enumerate(SHARD_ROWS):
        frozen = ~permitted[start : start + rows]
        assert_bits_equal(
            trained[start : start + rows][frozen],
            table[start : start + rows][frozen],
            f"frozen rows of shard {index}",
        )
        start += rows
    np.testing.assert_allclose(trained, reference.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.array_equal(trained[permitted], table[permitted])
    assert optimizer.has_compact_slots(weights) is compact
    if compact:
        assert optimizer.compact_slot_rows(weights) == reference_optimizer.compact_slot_rows(
            reference
        )


def test_sharded_compact_slots_are_per_shard_and_cannot_grow(rng):
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    permitted = np.zeros(VOCAB, bool)
    permitted[[0, 5]] = True
    with tf.variable_creator_scope(_sharding_creator):
        weights = keras.Variable(table, name="table")
        mask = keras.Variable(permitted, trainable=False, name="mask")
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=[(weights, mask)])
    optimizer.build([weights])
    assert optimizer.has_compact_slots(weights)
    sources = optimizer.gradient_sources([weights])
    grads = [
        tf.IndexedSlices(tf.ones([2, WIDTH]), tf.constant([0, 1]), tf.constant([r, WIDTH]))
        for r in SHARD_ROWS
    ]
    assert len(sources[0]) == len(SHARD_ROWS)
    optimizer.apply([grads], [weights])  # one gradient per shard, local ids
    assert optimizer.compact_slot_rows(weights) == 2  # rows 0 and 5 (shard 1, local 1)
    # Shard 0 holds one permitted row: room for 1 + 1 // 2 + 1 = 2 slot rows.
    mask.assign(np.ones(VOCAB, bool))
    # Row 0 has a slot row; rows 1 and 2 would make 3, where there is room for 2.
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"slot_capacity(.|\n)*rows needed:\D*3\D*at most:\D*2"
    ):
        optimizer.apply(
            [
                [tf.IndexedSlices(tf.ones([3, WIDTH]), tf.constant([0, 1, 2]), tf.constant([4, 3]))]
                + [None] * 2
            ],
            [weights],
        )


# --- a real cluster ------------------------------------------------------------------


def _run_example(arguments: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "partial_embedding.examples.parameter_server"]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        command + arguments,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _result(process: subprocess.Popen) -> dict:
    try:
        stdout, stderr = process.communicate(timeout=CLUSTER_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-4000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cluster_with_a_killed_worker_then_a_checkpoint_on_a_restarted_cluster(tmp_path):
    """Run 1: 6 steps one at a time on a 2 PS + 2 worker cluster, the mask
    changed before step 2 (freeze + unfreeze), worker 1 killed after step 3
    (restarted 2 steps later), a checkpoint at the end; every process ends.
    Run 2: a new cluster restores the checkpoint (table, mask, slots) and
    takes steps 6 to 9. Both against the same steps on one machine.

    The coordinator gives a closure whose worker fails to another worker; it
    runs a closure at least once (TensorFlow: "a function may be executed
    more than once", and not atomically). A step run twice applies its
    update twice to the permitted rows it touches; no run of any step writes
    a frozen row. The example counts each step's runs on a parameter server,
    and the reference replays a step as often as it ran.
    """
    seed = case_seed("test_parameter_server", "cluster") % (2**31)
    common = [
        "--vocab", "600", "--dim", "8", "--batch", "16", "--sequential", "--json",
        "--change-mask-at", "2", "--checkpoint", str(tmp_path / "checkpoint"),
        "--seed", str(seed),
    ]  # fmt: skip
    first = _run_example(
        common + ["--steps", "6", "--kill-worker-after", "3", "--save-table", str(tmp_path / "1")]
    )
    config = example.Config(
        vocab=600, dim=8, batch=16, sequential=True, change_mask_at=2, seed=seed, steps=10
    )
    initial, permitted, _ = example.initial_state(config)
    first_result = _result(first)
    second = _run_example(
        common
        + ["--first-step", "6", "--steps", "4", "--resume", "--save-table", str(tmp_path / "2")]
    )
    applied = {int(step): count for step, count in first_result["applied"].items()}
    # The single-machine reference runs while the second cluster trains.
    reference = example.train_single_machine(config, applied, snapshots=(6,))
    second_result = _result(second)
    applied.update({int(step): count for step, count in second_result["applied"].items()})
    assert applied == {}, f"a step ran more than once: {applied}"

    for result in (first_result, second_result):
        assert result["frozen_rows_bit_exact"]
        assert result["shard_rows"] == [300, 300]
        devices = ["/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]
        assert result["shard_devices"] == devices
        assert result["slot_devices"] == devices  # each shard's slots on its server
        assert result["compact_slots"]
    assert first_result["steps"] == 6 and second_result["steps"] == 4
    assert first_result["killed_worker_at"] == 3
    assert first_result["restarted_worker_at"] == 5
    # The coordinator saw worker 1 fail and ran its closures elsewhere.
    assert first_result["closures_failed_on_a_worker"] >= 1

    never_permitted = ~permitted & ~example.changed_mask(permitted, example.NUM_PS)
    for name, steps in (("1", 6), ("2", 10)):
        saved = np.load(tmp_path / f"{name}.npz")
        assert_bits_equal(saved["table"][never_permitted], initial[never_permitted], "frozen rows")
        np.testing.assert_allclose(saved["table"], reference[steps], rtol=1e-5, atol=1e-7)
        # The mask changed in run 1 is the one run 2 restored (it started
        # from the initial mask).
        np.testing.assert_array_equal(
            saved["mask"], example.changed_mask(permitted, example.NUM_PS)
        )
    # Run 2 matching the reference also shows that it resumed Adam's slots
    # and step count, not only the table.
