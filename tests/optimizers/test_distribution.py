"""PartialEmbedding + MaskedOptimizer on TensorFlow's distribution strategies.

Each strategy runs in its own subprocess (this file, run as a script): logical
CPU devices and cluster setups must be configured before TensorFlow
initializes its devices, and must not leak into other tests. The subprocess
prints one JSON line of results, which the test checks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from pe_testing import bits, make_rng, once_per_run, seed_environment

VOCAB = 10
WIDTH = 3
IDS_PER_SAMPLE = 4
GLOBAL_BATCH = 8
STEPS = 4
TIMEOUT_S = 240


# --- the subprocess side ---------------------------------------------------------


def _problem():
    """The same table, data and head in every process of a run (they share the seed)."""
    rng = make_rng("test_distribution", "problem")
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    permitted = np.zeros(VOCAB, bool)
    permitted[[0, 2, 3, 7, 9]] = True
    x = rng.integers(0, VOCAB, size=(STEPS * GLOBAL_BATCH, IDS_PER_SAMPLE)).astype(np.int32)
    y = rng.normal(size=(len(x), 1)).astype(np.float32)
    head = rng.normal(size=(IDS_PER_SAMPLE * WIDTH, 1)).astype(np.float32)
    return table, permitted, x, y, head


def _model(table, permitted, head):
    """The partial embedding, flattened, into a dense head (in the caller's scope)."""
    import keras

    import partial_embedding as pe

    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(head))
    model = keras.Sequential(
        [keras.Input((IDS_PER_SAMPLE,), dtype="int32"), layer, keras.layers.Flatten(), dense]
    )
    return layer, model


def _fit(strategy, rule: str, table, permitted, x, y, head, compact=False):
    import keras

    import partial_embedding as pe

    with strategy.scope():
        layer, model = _model(table, permitted, head)
        inner = {
            "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(0.05),
            "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
            "rowwise_adam": lambda: pe.RowwiseAdam(0.05, weight_decay=0.1),
        }[rule]()
        model.compile(optimizer=pe.MaskedOptimizer(inner, compact_slots=compact), loss="mse")
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    return layer, model, history.history["loss"]


def _custom_loop(strategy, rule: str, table, permitted, x, y, head, compact=False):
    """``strategy.run`` steps calling ``optimizer.apply``, each replica on its
    slice of the global batch (Keras 3.15's ``model.fit`` fails under
    MultiWorkerMirroredStrategy before the first step, also with a stock
    ``keras.layers.Embedding``: ``_maybe_symbolic_build`` cannot reduce the
    distributed batch)."""
    import keras
    import tensorflow as tf

    import partial_embedding as pe

    with strategy.scope():
        layer, model = _model(table, permitted, head)
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
        optimizer.build(model.trainable_variables)
    replicas = strategy.num_replicas_in_sync
    per_replica = GLOBAL_BATCH // replicas

    @tf.function
    def step(ids, targets):
        def replica_step(ids, targets):
            start = tf.distribute.get_replica_context().replica_id_in_sync_group * per_replica
            ids, targets = ids[start : start + per_replica], targets[start : start + per_replica]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ids, training=True) - targets)) / replicas
            variables = model.trainable_variables
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss

        losses = strategy.run(replica_step, args=(ids, targets))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    losses = []
    for batch in range(STEPS):
        chunk = slice(batch * GLOBAL_BATCH, (batch + 1) * GLOBAL_BATCH)
        losses.append(float(step(tf.constant(x[chunk]), tf.constant(y[chunk]))))
    return layer, model, losses


def _components(variable) -> list[np.ndarray]:
    inner = getattr(variable, "_value", variable)
    values = getattr(inner, "values", None)
    return [np.asarray(v.numpy()) for v in (values if values else [inner])]


def _run_mirrored() -> dict:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    table, permitted, x, y, head = _problem()
    results = {}
    for rule in ("sgd_momentum", "adamw", "rowwise_adam"):
        single, _, single_losses = _fit(
            tf.distribute.get_strategy(), rule, table, permitted, x, y, head
        )
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        layer, model, losses = _fit(strategy, rule, table, permitted, x, y, head)
        slots = [_components(v) for v in model.optimizer.variables if tuple(v.shape) == table.shape]
        compact_layer, compact_model, compact_losses = _fit(
            strategy, rule, table, permitted, x, y, head, compact=True
        )
        optimizer = compact_model.optimizer
        compact_slots = [
            _components(v)
            for v in optimizer.compact_slot_variables
            if tuple(v.shape)[1:] == (WIDTH,)
        ]
        slot_of_row = [v for v in optimizer.compact_slot_variables if "slot_of_row" in v.name]
        results[rule] = {
            "replicas": strategy.num_replicas_in_sync,
            "components": [c.tolist() for c in _components(layer.embeddings)],
            "slot_components": [[c.tolist() for c in slot] for slot in slots],
            "single": single.embeddings.numpy().tolist(),
            "losses": losses,
            "single_losses": single_losses,
            "compact": {
                "components": [c.tolist() for c in _components(compact_layer.embeddings)],
                "slot_components": [[c.tolist() for c in slot] for slot in compact_slots],
                "slot_of_row": [[c.tolist() for c in _components(v)] for v in slot_of_row],
                "losses": compact_losses,
                "has_compact_slots": optimizer.has_compact_slots(compact_layer.embeddings),
            },
        }
    return results


def _run_multi_worker(task_index: int, ports: list[int]) -> dict:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": task_index},
        }
    )
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    table, permitted, x, y, head = _problem()
    layer, model, losses = _custom_loop(strategy, "adam", table, permitted, x, y, head)
    single, _, single_losses = _custom_loop(
        tf.distribute.OneDeviceStrategy("/cpu:0"), "adam", table, permitted, x, y, head
    )
    return {
        "replicas": strategy.num_replicas_in_sync,
        "components": [c.tolist() for c in _components(layer.embeddings)],
        "single": single.embeddings.numpy().tolist(),
        "losses": losses,
        "single_losses": single_losses,
    }


def _run_parameter_server(ports: dict[str, list[int]]) -> dict:
    """An in-process cluster: 1 chief (this), 2 workers, 2 parameter servers."""
    import tensorflow as tf

    import partial_embedding as pe

    cluster = {
        "worker": [f"127.0.0.1:{port}" for port in ports["worker"]],
        "ps": [f"127.0.0.1:{port}" for port in ports["ps"]],
    }
    cluster_spec = tf.train.ClusterSpec(cluster)
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = 2
    config.intra_op_parallelism_threads = 1
    for job, addresses in cluster.items():
        for index in range(len(addresses)):
            tf.distribute.Server(
                cluster_spec,
                job_name=job,
                task_index=index,
                protocol="grpc",
                config=config,
                start=True,
            )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2),
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    table, permitted, x, y, head = _problem()
    learning_rate = 0.1
    with strategy.scope():
        sharded = tf.Variable(table, name="table")
        row_mask = tf.Variable(permitted, trainable=False, name="row_mask")
    shards = sharded.variables
    result = {
        "type": type(sharded).__name__,
        "shard_rows": [int(s.shape[0]) for s in shards],
        "shard_devices": [s.device for s in shards],
        "mask_type": type(row_mask).__name__,
    }
    head_tensor = tf.constant(head)

    @tf.function
    def step(ids, targets):
        def replica_step(ids, targets):
            with tf.GradientTape() as tape:
                rows = pe.masked_embedding_lookup(sharded, ids, row_mask)
                prediction = tf.reshape(rows, [tf.shape(ids)[0], -1]) @ head_tensor
                loss = tf.reduce_mean(tf.square(prediction - targets))
            gradients = tape.gradient(loss, shards)
            for gradient, start in zip(gradients, (0, shards[0].shape[0])):
                if gradient is None:
                    continue
                # The gradient holds the shard's own (local) row ids; update the
                # shard through the global table to check the id translation.
                pe.masked_scatter_sub(
                    sharded,
                    tf.cast(gradient.indices, tf.int64) + start,
                    gradient.values * learning_rate,
                    row_mask,
                )
            return loss

        return strategy.run(replica_step, args=(ids, targets))

    losses = []
    for batch in range(STEPS):
        chunk = slice(batch * GLOBAL_BATCH, (batch + 1) * GLOBAL_BATCH)
        # One step at a time: a sequential reference must see the same order.
        losses.append(float(coordinator.schedule(step, args=(x[chunk], y[chunk])).fetch()))
    coordinator.join()
    result["table"] = np.concatenate([s.numpy() for s in shards]).tolist()
    result["losses"] = losses

    # Out-of-range ids reach no shard.
    before = np.concatenate([s.numpy() for s in shards])
    try:
        with strategy.scope():
            pe.masked_scatter_sub(
                sharded, [1, VOCAB + 3], np.ones((2, WIDTH), np.float32), row_mask
            )
        result["bad_ids"] = "accepted"
    except tf.errors.InvalidArgumentError as error:
        result["bad_ids"] = error.message
    result["unchanged_after_bad_ids"] = bool(
        np.array_equal(before, np.concatenate([s.numpy() for s in shards]))
    )

    # The same steps, sequential, on a plain variable.
    plain = tf.Variable(table)
    reference_losses = []
    for batch in range(STEPS):
        chunk = slice(batch * GLOBAL_BATCH, (batch + 1) * GLOBAL_BATCH)
        with tf.GradientTape() as tape:
            rows = pe.masked_embedding_lookup(plain, x[chunk], permitted)
            prediction = tf.reshape(rows, [GLOBAL_BATCH, -1]) @ head_tensor
            loss = tf.reduce_mean(tf.square(prediction - y[chunk]))
        gradient = tape.gradient(loss, plain)
        pe.masked_scatter_sub(plain, gradient.indices, gradient.values * learning_rate, permitted)
        reference_losses.append(float(loss))
    result["reference_table"] = plain.numpy().tolist()
    result["reference_losses"] = reference_losses
    return result


def _main(arguments: list[str]) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    kind = arguments[0]
    if kind == "mirrored":
        result = _run_mirrored()
    elif kind == "multi_worker":
        result = _run_multi_worker(int(arguments[1]), json.loads(arguments[2]))
    else:
        result = _run_parameter_server(json.loads(arguments[1]))
    print("RESULT " + json.dumps(result), flush=True)


# --- the pytest side -------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _environment() -> dict[str, str]:
    environment = {
        **os.environ,
        **seed_environment(),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
    }
    environment.pop("TF_CONFIG", None)
    return environment


def _result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _run(*arguments: str) -> dict:
    completed = subprocess.run(
        [sys.executable, __file__, *arguments],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_environment(),
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return _result(completed.stdout)


def _float32(values) -> np.ndarray:
    """A float32 array of values that came through JSON."""
    return np.asarray(values, np.float32)


def _check_against_single_device(result: dict, rtol: float) -> None:
    table, permitted, *_ = _problem()
    components = [_float32(c) for c in result["components"]]
    for component in components:
        # Frozen rows bit for bit, on every copy.
        np.testing.assert_array_equal(bits(component[~permitted]), bits(table[~permitted]))
        # The copies stay identical.
        np.testing.assert_array_equal(bits(component), bits(components[0]))
    # Permitted rows as on one device (the gradient is summed in another order).
    np.testing.assert_allclose(components[0], np.asarray(result["single"]), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(result["losses"], result["single_losses"], rtol=rtol)
    assert not np.array_equal(components[0][permitted], table[permitted])


@pytest.fixture(scope="module")
def mirrored_results(tmp_path_factory) -> dict:
    return once_per_run(tmp_path_factory, "test_distribution.mirrored", lambda: _run("mirrored"))


@pytest.mark.slow
def test_mirrored_strategy_fit_on_two_cpu_devices(mirrored_results):
    results = mirrored_results
    table, permitted, *_ = _problem()
    for rule, result in results.items():
        assert result["replicas"] == 2, rule
        assert len(result["components"]) == 2, rule
        _check_against_single_device(result, rtol=1e-5)
        assert result["slot_components"], rule
        for slot in result["slot_components"]:
            assert len(slot) == 2
            for copy in slot:
                copy = _float32(copy)
                np.testing.assert_array_equal(
                    bits(copy[~permitted]), bits(np.zeros_like(copy[~permitted]))
                )
                np.testing.assert_array_equal(bits(copy), bits(_float32(slot[0])))


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_two_processes():
    ports = _free_ports(2)
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "multi_worker", str(index), json.dumps(ports)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_environment(),
        )
        for index in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=TIMEOUT_S)
            assert worker.returncode == 0, stderr[-4000:]
            outputs.append(_result(stdout))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for result in outputs:
        assert result["replicas"] == 2
        _check_against_single_device(result, rtol=1e-5)
    np.testing.assert_array_equal(
        bits(_float32(outputs[0]["components"][0])), bits(_float32(outputs[1]["components"][0]))
    )


@pytest.mark.slow
def test_parameter_server_strategy_with_a_sharded_table():
    ports = _free_ports(4)
    result = _run("parameter_server", json.dumps({"worker": ports[:2], "ps": ports[2:]}))
    table, permitted, *_ = _problem()
    assert result["type"] == "ShardedVariable", result["type"]
    assert result["shard_rows"] == [5, 5]
    # The partitioner shards the [V] mask alike: each shard reads its own slice.
    assert result["mask_type"] == "ShardedVariable"
    assert "/job:ps/replica:0/task:0" in result["shard_devices"][0]
    assert "/job:ps/replica:0/task:1" in result["shard_devices"][1]
    trained = _float32(result["table"])
    np.testing.assert_array_equal(bits(trained[~permitted]), bits(table[~permitted]))
    np.testing.assert_allclose(trained, np.asarray(result["reference_table"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result["losses"], result["reference_losses"], rtol=1e-6)
    assert not np.array_equal(trained[permitted], table[permitted])
    assert f"indices[1] = {VOCAB + 3} is not in [0, {VOCAB})" in result["bad_ids"]
    assert result["unchanged_after_bad_ids"]


# --- in-process: the ops on distributed variables, without a cluster ------------------


def _sharded_table():
    import tensorflow as tf
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    table, permitted, *_ = _problem()
    # Uneven shards, as FixedShardsPartitioner makes for 10 rows in 3.
    shards = [tf.Variable(table[:4]), tf.Variable(table[4:7]), tf.Variable(table[7:])]
    return table, permitted, ShardedVariable(shards)


def test_sharded_lookup_gradient_and_update_go_to_the_owning_shard():
    import tensorflow as tf

    import partial_embedding as pe

    table, permitted, sharded = _sharded_table()
    ids = np.array([[9, 0, 4], [4, 6, 1]], np.int64)
    with tf.GradientTape() as tape:
        rows = pe.masked_embedding_lookup(sharded, ids, permitted)
        loss = tf.reduce_sum(rows * rows)
    np.testing.assert_array_equal(bits(rows.numpy()), bits(table[ids]))
    gradients = tape.gradient(loss, sharded.variables)
    starts = [0, 4, 7]
    for shard_index, gradient in enumerate(gradients):
        owned = [
            i
            for i in ids.reshape(-1)
            if starts[shard_index] <= i < (starts + [VOCAB])[shard_index + 1]
        ]
        permitted_owned = [i for i in owned if permitted[i]]
        if not permitted_owned:
            assert gradient is None or gradient.values.shape[0] == 0
            continue
        # Local row ids of the shard, permitted occurrences only.
        local = sorted(int(i) + starts[shard_index] for i in gradient.indices.numpy())
        assert local == sorted(permitted_owned)

    updates = np.ones((ids.size, WIDTH), np.float32)
    pe.masked_scatter_sub(sharded, ids.reshape(-1), updates, permitted)
    after = np.concatenate([v.numpy() for v in sharded.variables])
    expected = table.astype(np.float64)
    for i in ids.reshape(-1):
        if permitted[i]:
            expected[i] -= 1
    np.testing.assert_array_equal(bits(after[~permitted]), bits(table[~permitted]))
    np.testing.assert_allclose(after, expected, rtol=1e-6)


def test_sharded_out_of_range_writes_no_shard():
    import pytest
    import tensorflow as tf

    import partial_embedding as pe

    table, permitted, sharded = _sharded_table()
    for bad in (-1, VOCAB):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=rf"indices\[2\] = {bad} is not in \[0, {VOCAB}\)"
        ):
            pe.masked_scatter_sub(
                sharded, [0, 9, bad], np.ones((3, WIDTH), np.float32), ~permitted | permitted
            )
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"ids\[1\] = {bad} is not in"):
            pe.masked_embedding_lookup(sharded, [5, bad], permitted)
    np.testing.assert_array_equal(
        bits(np.concatenate([v.numpy() for v in sharded.variables])), bits(table)
    )


def test_mirrored_variable_cross_replica_update_writes_every_copy():
    import tensorflow as tf

    import partial_embedding as pe

    table, permitted, *_ = _problem()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = tf.Variable(table)
        mask = tf.Variable(permitted, trainable=False)
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    ids = np.array([0, 1, 2, 2], np.int32)
    pe.masked_scatter_sub(mirrored, ids, np.ones((4, WIDTH), np.float32), mask)
    rows = pe.masked_embedding_lookup(mirrored, ids, mask)
    for component in mirrored.values:
        value = component.numpy()
        np.testing.assert_array_equal(bits(value[~permitted]), bits(table[~permitted]))
        np.testing.assert_allclose(value[2], table[2] - 2, rtol=1e-6)
        np.testing.assert_allclose(value[0], table[0] - 1, rtol=1e-6)
    np.testing.assert_array_equal(bits(rows.numpy()), bits(mirrored.values[0].numpy()[ids]))


if __name__ == "__main__":
    _main(sys.argv[1:])


@pytest.mark.slow
def test_mirrored_strategy_fit_with_compact_slots_equals_full_size_slots(mirrored_results):
    """Under MirroredStrategy, compact slots give every copy the same rows
    and slots, and the same table bit for bit as full-size slots."""
    table, permitted, *_ = _problem()
    for rule, result in mirrored_results.items():
        compact = result["compact"]
        assert compact["has_compact_slots"], rule
        for component in compact["components"]:
            np.testing.assert_array_equal(
                bits(_float32(component)), bits(_float32(result["components"][0]))
            )
        assert compact["losses"] == result["losses"], rule
        # Each copy of each compact slot and of the map is identical.
        assert compact["slot_components"] and compact["slot_of_row"], rule
        for copies in [*compact["slot_components"], *compact["slot_of_row"]]:
            assert len(copies) == 2
            np.testing.assert_array_equal(bits(_float32(copies[1])), bits(_float32(copies[0])))
        slot_of_row = np.asarray(compact["slot_of_row"][0][0])
        # Slot rows only for permitted rows; each full-size slot row of a
        # trained row equals its compact slot row.
        assert (slot_of_row[~permitted] == -1).all(), rule
        trained = np.flatnonzero(slot_of_row >= 0)
        full_slots = [_float32(slot[0]) for slot in result["slot_components"]]
        compact_slots = [_float32(slot[0]) for slot in compact["slot_components"]]
        assert len(full_slots) == len(compact_slots), rule
        for full, small in zip(full_slots, compact_slots):
            np.testing.assert_array_equal(
                bits(small[slot_of_row[trained].astype(int)]), bits(full[trained])
            )
