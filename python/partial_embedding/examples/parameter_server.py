"""ParameterServerStrategy training of a sharded PartialEmbedding with MaskedOptimizer.

``python -m partial_embedding.examples.parameter_server`` starts a cluster of
real processes on the loopback address (2 parameter servers and 2 workers,
each a ``tf.distribute.Server`` in its own Python process, on free ports),
and this process as the coordinator. The embedding table and its row mask
are split over the parameter servers by the strategy's
``variable_partitioner`` (``ShardedVariable``); ``MaskedOptimizer(Adam)``
keeps each shard's slots on that shard's server and updates each shard
there. Steps are scheduled with ``ClusterCoordinator``; it prints the steps
per second and checks that every frozen row is bit for bit unchanged.

Options (``--help``): the table's size, steps, a time bound, ``--sequential``
(one step at a time, comparable with a single-machine run),
``--kill-worker-after N`` (kill a worker process after N steps and restart
it later), ``--checkpoint DIR`` and ``--resume`` (save / restore the table,
mask and optimizer slots with ``tf.train.Checkpoint``), ``--combiner``
(pool each sample's ids in the layer, ``PartialEmbedding(combiner=...)``,
instead of ``GlobalAveragePooling1D``), ``--json`` (results as one JSON line).

The cluster's processes load this library's op library before starting
their server: a parameter server runs its kernels on its shards.
Every process is ended when this one ends (also on an error).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "NUM_PS",
    "NUM_WORKERS",
    "Config",
    "LocalCluster",
    "batch_of_step",
    "build",
    "change_mask",
    "changed_mask",
    "free_ports",
    "initial_state",
    "local_cluster",
    "main",
    "make_step",
    "serve",
    "table_partitioner",
    "train_on_cluster",
    "train_single_machine",
]

NUM_PS = 2
NUM_WORKERS = 2
_LOOPBACK = "127.0.0.1"
_READY_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Config:
    """What to train, and how."""

    vocab: int = 200_000
    dim: int = 32
    ids_per_sample: int = 8
    batch: int = 256
    #: Share of the rows that train (the others are frozen).
    permitted_share: float = 0.02
    learning_rate: float = 0.01
    seed: int = 0
    #: Global index of the first step of this run (after a resume: the
    #: steps already taken) and how many steps to take.
    first_step: int = 0
    steps: int = 200
    #: Stop scheduling after this many seconds (the steps taken are reported).
    max_seconds: float = 60.0
    #: One step at a time (schedule, then fetch), in order: the result can be
    #: compared with a single-machine run. Else steps run concurrently on the
    #: workers (asynchronous training, as ParameterServerStrategy intends).
    sequential: bool = False
    #: Before this global step: freeze the first permitted row of each shard,
    #: unfreeze the first frozen one, with the layer's ``freeze`` and
    #: ``unfreeze`` (None: never).
    change_mask_at: int | None = None
    #: Kill worker 1 after this many steps of this run (None: never); it is
    #: restarted a few steps later.
    kill_worker_after: int | None = None
    checkpoint: str | None = None
    resume: bool = False
    compact_slots: Any = "auto"
    #: The layer's combiner (None: per-id rows, mean-pooled by a Keras layer).
    combiner: str | None = None


# -- the problem: the same in every process (seeded) --------------------------------


def initial_state(config: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The initial table, its row mask and the dense head's kernel."""
    rng = np.random.default_rng([config.seed, 1])
    table = rng.normal(scale=0.1, size=(config.vocab, config.dim)).astype(np.float32)
    permitted = rng.random(config.vocab) < config.permitted_share
    head = rng.normal(size=(config.dim, 1)).astype(np.float32)
    return table, permitted, head


def batch_of_step(config: Config, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s ids and targets (a function of the global step only)."""
    rng = np.random.default_rng([config.seed, 2, step])
    ids = rng.integers(0, config.vocab, size=(config.batch, config.ids_per_sample))
    targets = rng.normal(size=(config.batch, 1)).astype(np.float32)
    return ids.astype(np.int64), targets


def changed_mask(permitted: np.ndarray, num_shards: int) -> np.ndarray:
    """The mask after ``change_mask_at``: in each shard's row range, the
    first permitted row frozen and the first frozen row unfrozen."""
    mask = permitted.copy()
    for rows in np.array_split(np.arange(len(mask)), num_shards):
        permitted_rows = rows[permitted[rows]]
        frozen_rows = rows[~permitted[rows]]
        if len(permitted_rows):
            mask[permitted_rows[0]] = False
        if len(frozen_rows):
            mask[frozen_rows[0]] = True
    return mask


def change_mask(layer: Any, permitted: np.ndarray) -> None:
    """Applies ``changed_mask`` to ``layer`` with ``freeze`` and ``unfreeze``."""
    target = changed_mask(permitted, NUM_PS)
    layer.freeze(np.flatnonzero(permitted & ~target))
    layer.unfreeze(np.flatnonzero(target & ~permitted))


def table_partitioner(vocab: int, num_shards: int) -> Any:
    """Splits variables of ``vocab`` rows (the table and its mask) into
    ``num_shards`` alike; keeps every other variable whole."""

    def partition(shape: Any, dtype: Any) -> list[int]:
        del dtype
        rank = len(shape)
        if rank and shape[0] == vocab:
            return [num_shards] + [1] * (rank - 1)
        return [1] * rank

    return partition


def build(config: Config, table: np.ndarray, permitted: np.ndarray, head: np.ndarray) -> Any:
    """The model (a partial embedding, mean-pooled, into a dense head) and
    its optimizer, built (in the caller's strategy scope)."""
    import keras

    import partial_embedding as pe

    layer = pe.PartialEmbedding(
        config.vocab,
        config.dim,
        trainable_ids=permitted,
        weights=table,
        name="embedding",
        combiner=config.combiner,
    )
    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(head))
    pooling = [] if config.combiner else [keras.layers.GlobalAveragePooling1D()]
    model = keras.Sequential(
        [keras.Input((config.ids_per_sample,), dtype="int64"), layer, *pooling, dense]
    )
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(config.learning_rate), compact_slots=config.compact_slots
    )
    optimizer.build(model.trainable_variables)
    return layer, model, optimizer


def make_step(model: Any, optimizer: Any) -> Any:
    """One training step on one batch (the replica function)."""
    import tensorflow as tf

    import partial_embedding as pe

    variables = model.trainable_variables
    sources = pe.MaskedOptimizer.gradient_sources(variables)

    def step(ids: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - targets))
        optimizer.apply(tape.gradient(loss, sources), variables)
        return loss

    return step


def train_single_machine(
    config: Config, applied: dict[int, int] | None = None, snapshots: tuple[int, ...] = ()
) -> dict[int, np.ndarray]:
    """The same training in this process, without a cluster.

    Steps ``[0, first_step + steps)`` in order, step ``i`` applied
    ``applied[i]`` times (default once).

    Returns:
      The table after each step count in ``snapshots`` and after the last.
    """
    import tensorflow as tf

    table, permitted, head = initial_state(config)
    layer, model, optimizer = build(config, table, permitted, head)
    step = tf.function(make_step(model, optimizer))
    total = config.first_step + config.steps
    tables = {}
    for index in range(total):
        if config.change_mask_at == index:
            change_mask(layer, permitted)
        for _ in range((applied or {}).get(index, 1)):
            step(*batch_of_step(config, index))
        if index + 1 in snapshots or index + 1 == total:
            tables[index + 1] = np.asarray(layer.embeddings.numpy())
    return tables


# -- the cluster ------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on the loopback address."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((_LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def serve(job: str, index: int, cluster: dict[str, list[str]]) -> None:
    """A cluster process: loads this library's ops, runs a server forever.

    It runs this file as a script: TensorFlow and the op library (the
    kernels a parameter server runs on its shards), without Keras.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tf.load_op_library(os.path.join(package, "_partial_embedding_ops.so"))

    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = 2
    config.intra_op_parallelism_threads = 1
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        config=config,
        start=True,
    )
    server.join()


class LocalCluster:
    """Parameter servers and workers, each a process on a loopback port."""

    def __init__(self, num_ps: int = NUM_PS, num_workers: int = NUM_WORKERS) -> None:
        ports = free_ports(num_ps + num_workers)
        self.cluster = {
            "worker": [f"{_LOOPBACK}:{port}" for port in ports[:num_workers]],
            "ps": [f"{_LOOPBACK}:{port}" for port in ports[num_workers:]],
        }
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}

    def start(self, job: str, index: int) -> None:
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--serve",
            job,
            str(index),
            json.dumps(self.cluster),
        ]
        self.processes[(job, index)] = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def start_all(self) -> None:
        for job, addresses in self.cluster.items():
            for index in range(len(addresses)):
                self.start(job, index)
        for job, addresses in self.cluster.items():
            for index in range(len(addresses)):
                self.wait_ready(job, index)

    def wait_ready(self, job: str, index: int, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Waits until the task accepts connections."""
        host, port = self.cluster[job][index].rsplit(":", 1)
        deadline = time.monotonic() + timeout_s
        while True:
            process = self.processes[(job, index)]
            if process.poll() is not None:
                raise RuntimeError(f"{job} {index} exited with {process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job} {index} not listening after {timeout_s} s")
            time.sleep(0.2)

    def kill(self, job: str, index: int) -> None:
        """Kills one task's process at once (SIGKILL), as a machine failure."""
        process = self.processes[(job, index)]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait()


@contextlib.contextmanager
def local_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


# -- the coordinator --------------------------------------------------------------


class _WorkerFailures(logging.Handler):
    """Counts the coordinator's reports of a closure that failed because its
    worker was unavailable (it then runs the closure on another worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Worker /job:worker") and " failed with " in message:
            self.count += 1


@dataclasses.dataclass
class _ClusterTraining:
    """What :func:`set_up_cluster_training` makes for the training loop."""

    strategy: Any
    coordinator: Any
    layer: Any
    optimizer: Any
    step: Any
    applied: Any
    manager: Any
    table: np.ndarray
    permitted: np.ndarray
    setup_s: float


@dataclasses.dataclass
class _Progress:
    """What the training loop did."""

    losses: list[Any] = dataclasses.field(default_factory=list)
    taken: int = 0
    killed_at: int | None = None
    restarted_at: int | None = None
    first_step_s: float = 0.0
    train_s: float = 0.0
    worker_failures: int = 0


def set_up_cluster_training(config: Config, cluster: LocalCluster) -> _ClusterTraining:
    """The strategy over ``cluster``, the model and optimizer made in its
    scope (restored from the checkpoint when resuming), and the step."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.cluster), rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=table_partitioner(config.vocab, NUM_PS)
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    table, permitted, head = initial_state(config)
    started = time.perf_counter()
    with strategy.scope():
        layer, model, optimizer = build(config, table, permitted, head)
        # How often each step ran (a closure may run more than once).
        applied = tf.Variable(tf.zeros([config.steps], tf.int32), name="applied")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = None
    if config.checkpoint:
        manager = tf.train.CheckpointManager(checkpoint, config.checkpoint, max_to_keep=1)
        if config.resume:
            checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    replica_step = make_step(model, optimizer)

    @tf.function
    def step(ids: Any, targets: Any, position: Any) -> Any:
        def counted_step(ids: Any, targets: Any, position: Any) -> Any:
            loss = replica_step(ids, targets)
            with tf.control_dependencies([loss]):
                applied.assign_add(tf.one_hot(position, config.steps, dtype=tf.int32))
            return loss

        return strategy.run(counted_step, args=(ids, targets, position))

    setup_s = time.perf_counter() - started
    return _ClusterTraining(
        strategy, coordinator, layer, optimizer, step, applied, manager, table, permitted, setup_s
    )


def kill_or_restart_worker(
    config: Config, cluster: LocalCluster, training: _ClusterTraining, progress: _Progress
) -> None:
    """Before step ``progress.taken``: kills worker 1 at ``kill_worker_after``
    (between two steps with ``sequential``), starts it again two steps later."""
    if config.kill_worker_after is None:
        return
    position = progress.taken
    if position == config.kill_worker_after:
        if config.sequential:
            training.coordinator.join()  # Between two steps: none is cut short.
        cluster.kill("worker", 1)
        progress.killed_at = position
    elif (
        progress.killed_at is not None
        and progress.restarted_at is None
        and position == progress.killed_at + 2
    ):
        cluster.start("worker", 1)
        progress.restarted_at = position


def run_cluster_training(
    config: Config, cluster: LocalCluster, training: _ClusterTraining
) -> _Progress:
    """Schedules the steps on the workers (changing the mask, killing and
    restarting a worker where ``config`` says), then waits for them all."""
    import tensorflow as tf

    failures = _WorkerFailures()
    logging.getLogger("tensorflow").addHandler(failures)
    progress = _Progress()
    started = time.perf_counter()
    for position in range(config.steps):
        index = config.first_step + position
        if position == 1:
            # The first step traces the function and sends it to the
            # workers: timed apart.
            progress.losses[0].fetch()
            progress.first_step_s = time.perf_counter() - started
        if time.perf_counter() - started > config.max_seconds:
            break
        if config.change_mask_at == index:
            training.coordinator.join()
            change_mask(training.layer, training.permitted)
        kill_or_restart_worker(config, cluster, training, progress)
        ids, targets = batch_of_step(config, index)
        loss = training.coordinator.schedule(
            training.step, args=(tf.constant(ids), tf.constant(targets), tf.constant(position))
        )
        progress.losses.append(loss)
        if config.sequential:
            loss.fetch()
        progress.taken += 1
    training.coordinator.join()
    logging.getLogger("tensorflow").removeHandler(failures)
    progress.worker_failures = failures.count
    progress.train_s = time.perf_counter() - started - progress.first_step_s
    return progress


def _cluster_results(
    config: Config, training: _ClusterTraining, progress: _Progress
) -> dict[str, Any]:
    """The figures and final state :func:`train_on_cluster` returns."""
    layer, optimizer, permitted, table = (
        training.layer,
        training.optimizer,
        training.permitted,
        training.table,
    )
    taken = progress.taken
    shards = layer.embeddings.value.variables
    trained = np.asarray(layer.embeddings.numpy())
    never_permitted = ~permitted
    if config.change_mask_at is not None and config.change_mask_at < config.first_step + taken:
        never_permitted &= ~changed_mask(permitted, NUM_PS)
    slot_devices = {
        shard_slot.device
        for name in optimizer.slot_names()
        for shard_slot in optimizer.slot_variable(layer.embeddings, name)
    }
    return {
        "steps": taken,
        "steps_per_s": (taken - 1) / progress.train_s if taken > 1 else 0.0,
        "setup_s": training.setup_s,
        "first_step_s": progress.first_step_s,
        "train_s": progress.train_s,
        "losses": [float(loss.fetch()) for loss in progress.losses],
        # The steps taken that ran other than once (none without failures).
        "applied": {
            config.first_step + i: int(c)
            for i, c in enumerate(training.applied.numpy()[:taken])
            if c != 1
        },
        "frozen_rows": int(never_permitted.sum()),
        "frozen_rows_bit_exact": bool(
            np.array_equal(
                trained[never_permitted].view(np.uint32), table[never_permitted].view(np.uint32)
            )
        ),
        "shard_devices": [shard.device for shard in shards],
        "shard_rows": [int(shard.shape[0]) for shard in shards],
        "slot_devices": sorted(slot_devices),
        "compact_slots": optimizer.has_compact_slots(layer.embeddings),
        "killed_worker_at": progress.killed_at,
        "closures_failed_on_a_worker": progress.worker_failures,
        "restarted_worker_at": progress.restarted_at,
        "table": trained,
        "mask": np.asarray(layer.trainable_mask.numpy()),
    }


def train_on_cluster(config: Config, cluster: LocalCluster) -> dict[str, Any]:
    """Trains on ``cluster`` from this process (the coordinator): set up,
    train (killing and restarting a worker where ``config`` says), save the
    checkpoint, and report."""
    training = set_up_cluster_training(config, cluster)
    progress = run_cluster_training(config, cluster, training)
    if training.manager is not None:
        training.manager.save()
    return _cluster_results(config, training, progress)


def _parse(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.examples.parameter_server", description=__doc__
    )
    defaults = Config()
    parser.add_argument("--vocab", type=int, default=defaults.vocab)
    parser.add_argument("--dim", type=int, default=defaults.dim)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--permitted-share", type=float, default=defaults.permitted_share)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--first-step", type=int, default=defaults.first_step)
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    parser.add_argument("--sequential", action="store_true")
    parser.add_argument("--change-mask-at", type=int, default=None)
    parser.add_argument("--kill-worker-after", type=int, default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--compact-slots", choices=["auto", "true", "false"], default="auto")
    parser.add_argument("--combiner", choices=["sum", "mean", "sqrtn"], default=None)
    parser.add_argument("--json", action="store_true", help="print results as one JSON line")
    parser.add_argument(
        "--save-table", default=None, help="write the trained table and mask to this .npz"
    )
    args = parser.parse_args(argv)
    config = Config(
        vocab=args.vocab,
        dim=args.dim,
        batch=args.batch,
        permitted_share=args.permitted_share,
        seed=args.seed,
        steps=args.steps,
        first_step=args.first_step,
        max_seconds=args.max_seconds,
        sequential=args.sequential,
        change_mask_at=args.change_mask_at,
        kill_worker_after=args.kill_worker_after,
        checkpoint=args.checkpoint,
        resume=args.resume,
        compact_slots={"auto": "auto", "true": True, "false": False}[args.compact_slots],
        combiner=args.combiner,
    )
    return config, args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(argv[1], int(argv[2]), json.loads(argv[3]))
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    config, args = _parse(argv)
    with local_cluster() as cluster:
        result = train_on_cluster(config, cluster)
    table, mask = result.pop("table"), result.pop("mask")
    if args.save_table:
        np.savez(args.save_table, table=table, mask=mask)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{NUM_PS} parameter servers, {NUM_WORKERS} workers on {_LOOPBACK}; "
            f"table {config.vocab} x {config.dim} in shards of {result['shard_rows']} rows "
            f"({int(mask.sum())} rows trainable, compact slots: {result['compact_slots']})"
        )
        print(
            f"{result['steps']} steps of {config.batch} x {config.ids_per_sample} ids: "
            f"{result['steps_per_s']:.1f} steps/s after the first "
            f"(which traced the step: {result['first_step_s']:.1f} s; "
            f"model built on the cluster in {result['setup_s']:.1f} s)"
        )
        print(
            f"frozen rows bit for bit unchanged: {result['frozen_rows_bit_exact']} "
            f"({result['frozen_rows']} rows)"
        )
    return 0 if result["frozen_rows_bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
