"""MaskedOptimizer's defaults on a ParameterServerStrategy cluster.

* A whole (unsharded) table on one parameter server, ``PartialEmbedding`` and
  ``MaskedOptimizer(Adam)`` with default options: a step through
  ``ClusterCoordinator`` finishes and every cluster process lives on (growable
  compact slots used to abort the servers with ``Check failed: size >= 0``).
* A cluster whose servers run in the coordinator's process: too few inter-op
  threads is refused at ``build`` with the setting named, instead of a step
  that never finishes; enough threads train.

Each cluster runs under a coordinator in a subprocess (this file run as a
script), in its own process group, killed whole after a time bound: a hang or
a crash fails the test, never the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

CLUSTER_TIMEOUT_S = 240
VOCAB, WIDTH = 50, 4
TRAINABLE_IDS = list(range(0, VOCAB, 5))
BATCH_IDS = [0, 1, 5, 10, 5, 49]


def _coordinate(arguments: list[str]) -> dict:
    """Runs this file as a coordinator; its JSON result line."""
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        start_new_session=True,  # Its cluster processes share its group.
    )
    try:
        stdout, stderr = process.communicate(timeout=CLUSTER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"the cluster did not finish one step in {CLUSTER_TIMEOUT_S} s (a hang)")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {process.returncode}: {stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.mark.slow
def test_whole_table_with_default_options_keeps_every_server_alive():
    result = _coordinate(["whole_table"])
    assert result["alive"] == {"ps0": True, "ps1": True, "worker0": True, "worker1": True}
    assert result["finished"], result
    assert result["compact_slots"] and result["slot_rows_used"] == 3
    # Rows 0, 5 and 10 trained; 1 and 49 are frozen, bit for bit.
    assert result["changed_rows"] == [0, 5, 10]
    assert result["frozen_rows_bit_exact"]


def test_in_process_cluster_with_one_inter_op_thread_is_refused_at_build():
    result = _coordinate(["in_process", "1"])
    assert result["refused"], result
    assert "inter_op_parallelism_threads" in result["message"]
    assert "worker task" in result["message"]


@pytest.mark.slow
def test_in_process_cluster_with_enough_inter_op_threads_trains():
    result = _coordinate(["in_process", "3"])
    assert not result["refused"], result["message"]
    assert result["finished"] and result["changed_rows"] == [0, 5, 10]
    assert result["frozen_rows_bit_exact"]


# --- the coordinator (this file run as a script) ----------------------------------


def _train_one_step(strategy, alive) -> dict:
    """One scheduled step of PartialEmbedding + MaskedOptimizer(Adam)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import partial_embedding as pe

    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=TRAINABLE_IDS)
        layer.build((None,))
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
        try:
            optimizer.build(layer.trainable_variables)
        except pe.PartialEmbeddingArgumentError as error:
            return {"refused": True, "message": str(error)}
    variables = layer.trainable_variables
    sources = pe.MaskedOptimizer.gradient_sources(variables)

    @tf.function
    def step(ids):
        def replica_step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(layer(ids) - 1.0))
            optimizer.apply(tape.gradient(loss, sources), variables)
            return loss

        return strategy.run(replica_step, args=(ids,))

    before = np.asarray(layer.embeddings.numpy())
    coordinator.schedule(step, args=(tf.constant(BATCH_IDS, tf.int64),))
    deadline = time.monotonic() + CLUSTER_TIMEOUT_S / 2
    finished = False
    while all(alive().values()) and time.monotonic() < deadline:
        if coordinator.done():
            finished = True
            break
        time.sleep(0.2)
    result = {"refused": False, "message": "", "finished": finished, "alive": alive()}
    if finished:
        after = np.asarray(layer.embeddings.numpy())
        frozen = np.ones(VOCAB, bool)
        frozen[TRAINABLE_IDS] = False
        result.update(
            changed_rows=np.flatnonzero((after != before).any(axis=1)).tolist(),
            frozen_rows_bit_exact=bool(
                np.array_equal(after[frozen].view(np.uint32), before[frozen].view(np.uint32))
            ),
            compact_slots=optimizer.has_compact_slots(layer.embeddings),
            slot_rows_used=optimizer.compact_slot_rows(layer.embeddings),
        )
    return result


def _whole_table() -> dict:
    """Real server processes; the table whole on one parameter server."""
    import tensorflow as tf

    from partial_embedding.examples import parameter_server as example

    with example.local_cluster() as cluster:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster.cluster), rpc_layer="grpc"
        )
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)

        def alive() -> dict[str, bool]:
            return {f"{job}{i}": p.poll() is None for (job, i), p in cluster.processes.items()}

        return _train_one_step(strategy, alive)


def _in_process(inter_op_threads: int) -> dict:
    """Two workers and two parameter servers in this process; the table
    sharded over the parameter servers."""
    import tensorflow as tf

    from partial_embedding.examples import parameter_server as example

    ports = example.free_ports(4)
    spec = {
        "worker": [f"127.0.0.1:{port}" for port in ports[:2]],
        "ps": [f"127.0.0.1:{port}" for port in ports[2:]],
    }
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads)
    # Kept: the check reads a server's configuration from its object (one
    # that is gone counts as configured by default).
    servers = [
        tf.distribute.Server(
            tf.train.ClusterSpec(spec), job_name=job, task_index=index, config=config
        )
        for job, addresses in spec.items()
        for index in range(len(addresses))
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=example.table_partitioner(VOCAB, 2)
    )
    result = _train_one_step(strategy, lambda: {})
    del servers
    return result


if __name__ == "__main__":
    mode = sys.argv[1]
    outcome = _whole_table() if mode == "whole_table" else _in_process(int(sys.argv[2]))
    print(json.dumps(outcome), flush=True)
    # In-process servers cannot be stopped; skip their teardown.
    os._exit(0)
