"""What a ParameterServerStrategy cluster asks of ``MaskedOptimizer``.

* ``needs_fixed_capacity``: compact slots that must keep a static row count.
  A ``ParameterServerStrategy`` step runs on a worker while the variables live
  on a parameter server; TensorFlow passes the handle of a variable with an
  unknown dimension between tasks as a shape of ``-1`` rows, and the receiving
  server aborts (``tensor_shape.cc: Check failed: size >= 0``). Such slots get
  a fixed capacity, as a sharded table's do.
* ``check_in_process_servers``: a cluster whose servers run in this process
  with too few inter-op threads never finishes a step (TensorFlow itself, with
  or without this library: TensorFlow's own multi-worker tests give their
  in-process workers ``num_workers + 1`` inter-op threads for this reason; an
  inter-op pool of 0 threads gets one per usable CPU, so 1 on a machine or
  container with one).
  Refused at ``build`` with the setting to change, instead of a hang.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops import resolve_variable

#: The fewest inter-op threads an in-process worker finished a step with.
MIN_WORKER_INTER_OP_THREADS = 2


def is_parameter_server_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is a ``ParameterServerStrategy`` (TF2 or TF1)."""
    kinds = tuple(
        kind
        for kind in (
            getattr(tf.distribute.experimental, "ParameterServerStrategy", None),
            getattr(tf.compat.v1.distribute.experimental, "ParameterServerStrategy", None),
        )
        if isinstance(kind, type)
    )
    return bool(kinds) and isinstance(strategy, kinds)


def _task_of(device: str) -> tuple[str | None, int, int]:
    spec = tf.DeviceSpec.from_string(device)
    return spec.job, spec.replica or 0, spec.task or 0


def needs_fixed_capacity(variable: Any) -> bool:
    """Whether compact slots of ``variable`` must keep a fixed row count:
    under ``ParameterServerStrategy`` (steps run on workers, the variable on a
    parameter server) or when the variable lives on another task of a
    cluster than this process."""
    if is_parameter_server_strategy(tf.distribute.get_strategy()):
        return True
    try:
        device = resolve_variable(variable, argument="variable").device
    except PartialEmbeddingTypeError:
        return False
    if not device or tf.DeviceSpec.from_string(device).job is None:
        return False
    with tf.init_scope():
        local_device = tf.constant(0).device
    return _task_of(device) != _task_of(local_device)


def _schedulable_cpus() -> int:
    """What an inter-op pool of ``0`` threads gets: one per usable CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not Linux.
        return os.cpu_count() or 1


def _servers_in_this_process() -> list[tf.distribute.Server]:
    return [obj for obj in gc.get_objects() if isinstance(obj, tf.distribute.Server)]


def _listening_ports_of_this_process() -> set[int]:
    """TCP ports this process listens on (Linux; elsewhere none are known).

    An in-process server outlives its Python object, so the object alone
    cannot tell whether a task is served here."""
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    sockets = set()
    for descriptor in descriptors:
        try:  # Some close meanwhile (the listing's own, for one).
            link = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        if link.startswith("socket:["):
            sockets.add(link[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table, encoding="ascii") as file:
                rows = [line.split() for line in file.read().splitlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 9 and row[3] == "0A" and row[9] in sockets:  # 0A: LISTEN
                ports.add(int(row[1].rsplit(":", 1)[1], 16))
    return ports


def _inter_op_threads(configured: int) -> int:
    if configured < 0:  # Ops run in the caller's thread.
        return 1
    return configured or _schedulable_cpus()


def _in_process_tasks(cluster: tf.train.ClusterSpec) -> dict[tuple[str, int], int | None]:
    """The cluster's tasks served by this process, with their configured
    inter-op threads (None: the server's Python object is gone)."""
    tasks: dict[tuple[str, int], int | None] = {}
    for server in _servers_in_this_process():
        server_def = server.server_def
        job, index = server_def.job_name, server_def.task_index
        if job not in cluster.jobs or index not in cluster.task_indices(job):
            continue
        own = tf.train.ClusterSpec(server_def.cluster)
        if job in own.jobs and own.task_address(job, index) == cluster.task_address(job, index):
            tasks[(job, index)] = server_def.default_session_config.inter_op_parallelism_threads
    ports = _listening_ports_of_this_process()
    for job in cluster.jobs:
        for index in cluster.task_indices(job):
            port = cluster.task_address(job, index).rsplit(":", 1)[-1]
            if port.isdigit() and int(port) in ports:
                tasks.setdefault((job, index), None)
    return tasks


def _cluster_spec(strategy: Any) -> tf.train.ClusterSpec | None:
    """The strategy's cluster: its resolver's, else (ParameterServerStrategy
    does not expose its resolver) that of a server in this process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    resolver = resolver or framework_private.cluster_resolver_of(strategy)
    if resolver is not None:
        return resolver.cluster_spec()
    for server in _servers_in_this_process():
        return tf.train.ClusterSpec(server.server_def.cluster)
    return None


def check_in_process_servers(strategy: Any) -> None:
    """Refuses a ``ParameterServerStrategy`` cluster with servers in this
    process whose inter-op thread pools are too small to finish a step.

    A worker needs at least 2 inter-op threads: measured on a 2-core machine
    with 2 workers and 2 parameter servers in one process, a worker with 1
    hung (whatever the parameter servers had) and one with 2 or 3 finished;
    TensorFlow's own in-process test clusters give workers ``num_workers + 1``
    (the error suggests that, the safer value). A server whose Python object
    is gone counts as configured by default (one thread per usable CPU, so a
    single-CPU container gets the 1 that hangs). Servers in other processes
    never hung.

    Raises:
      PartialEmbeddingArgumentError: such a server, named with the setting.
    """
    if not is_parameter_server_strategy(strategy):
        return
    cluster = _cluster_spec(strategy)
    if cluster is None:
        return
    num_workers = cluster.num_tasks("worker") if "worker" in cluster.jobs else 0
    for (job, index), configured in sorted(_in_process_tasks(cluster).items()):
        threads = _inter_op_threads(configured or 0)
        if job == "worker" and threads < MIN_WORKER_INTER_OP_THREADS:
            raise PartialEmbeddingArgumentError(
                f"MaskedOptimizer under ParameterServerStrategy: the {job} task {index} "
                f"is a tf.distribute.Server in this process with {threads} inter-op "
                f"thread(s) (inter_op_parallelism_threads={configured}); a step on an "
                f"in-process cluster never finishes with fewer than {MIN_WORKER_INTER_OP_THREADS}. "
                "Start it with config=tf.compat.v1.ConfigProto("
                f"inter_op_parallelism_threads={num_workers + 1}) or in its own process"
            )
