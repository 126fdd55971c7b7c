"""A table larger than the GPU: ``python -m partial_embedding.bench --gpu-host-table``.

Issue #45's third figure. TensorFlow is allowed a fixed amount of GPU memory
(``--memory-limit-mb``, a logical device configuration set in a fresh
process before TensorFlow touches the GPU), and a ``PartialEmbedding`` table
twice that size trains with ``frozen_rows_on="host"`` (the frozen table in
host memory, the 1 % of rows that learn and their Adam state on the GPU).
In that process, in interleaved rounds (medians; all three without XLA,
the host layout's lookup gathering on the host), three steps of the same pooled model
(``bench._models.pooled_model``, 256 samples of 16 ids, D = 64, Adam):

* ``host``: ours, the table twice the limit, ``MaskedOptimizer(Adam)``;
* ``fits``: ours with a table that fits (a quarter of the limit), on the GPU;
* ``stock_cpu``: the stock alternative for a table that does not fit,
  ``keras.layers.Embedding`` + ``Adam`` built under ``tf.device("/CPU:0")``
  (its Adam slots next to it: dense Adam over every row on the CPU).

Targets: the frozen table bit for bit after the steps (a correctness check:
exit 1 when it fails); ``host`` at most 3x ``fits``; ``stock_cpu`` at least
5x ``host``. The findings are printed as one JSON line after ``JSON_PREFIX``
(and written to ``--json``). ``--quick --device /CPU:0`` runs it all on the
CPU with a small pretend limit (the table sized from it, no limit set): a
check of the tool, whose figures are not GPU figures and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.bench._models import keras_step, pooled_model

__all__ = [
    "FITS_OVER_LIMIT",
    "HOST_OVER_FITS_TARGET",
    "JSON_PREFIX",
    "STOCK_OVER_HOST_TARGET",
    "TABLE_OVER_LIMIT",
    "main",
    "measure",
]

#: What the findings' JSON line starts with (device_check_report.py reads it).
JSON_PREFIX = "GPU_HOST_TABLE_JSON "
#: The host-layout table's bytes over the GPU memory TensorFlow may use.
TABLE_OVER_LIMIT = 2
#: The fitting table's bytes over that limit.
FITS_OVER_LIMIT = 0.25
#: Issue #45's targets: our host-layout step at most this many times the
#: step with a table that fits ...
HOST_OVER_FITS_TARGET = 3.0
#: ... and the stock alternative at least this many times slower than ours.
STOCK_OVER_HOST_TARGET = 5.0

_LIMIT_ENVIRONMENT = "PE_BENCH_HOST_TABLE_LIMIT_MB"
_DEVICE_ENVIRONMENT = "PE_BENCH_HOST_TABLE_DEVICE"

# The child's first lines: the logical memory limit, before anything (the
# package included) can make TensorFlow initialise the GPU.
_CHILD = f"""
import os, sys
import tensorflow as tf
limit = int(os.environ["{_LIMIT_ENVIRONMENT}"])
device = os.environ["{_DEVICE_ENVIRONMENT}"]
gpus = tf.config.list_physical_devices("GPU")
if gpus and tf.DeviceSpec.from_string(device).device_type == "GPU":
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit)])
from partial_embedding.bench._gpu_host_table import child_main
child_main(sys.argv[1:])
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --gpu-host-table",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=int,
        default=None,
        help="GPU memory TensorFlow may use (default 512; --quick: 8, a pretend limit on the CPU)",
    )
    parser.add_argument("--device", default="/GPU:0", help="the compute device (default /GPU:0)")
    parser.add_argument("--quick", action="store_true", help="small and short: a check of the tool")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ids-per-sample", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 2)")
    parser.add_argument("--steps", type=int, default=None, help="per round; default 4 (--quick: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=600, help="seconds for the child process")
    parser.add_argument("--json", default=None, help="where to write the findings")
    return parser


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    arguments = _parser().parse_args(argv)
    if arguments.memory_limit_mb is None:
        arguments.memory_limit_mb = 8 if arguments.quick else 512
    if arguments.rounds is None:
        arguments.rounds = 2 if arguments.quick else 3
    if arguments.steps is None:
        arguments.steps = 2 if arguments.quick else 4
    if arguments.quick:
        arguments.batch, arguments.ids_per_sample = min(arguments.batch, 32), 4
    return arguments


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Runs the measurement in a fresh process and relays its output.

    Args:
        argv: The flags after ``--gpu-host-table`` (default: ``sys.argv[1:]``).

    Returns:
        The findings (also written to ``--json``), or None when the child
        printed none.

    Raises:
        SystemExit: 1 when the frozen rows changed or the child failed, 2 when
            TensorFlow sees no GPU and ``--device`` names one.

    >>> main(["--quick", "--device", "/CPU:0"])  # doctest: +SKIP
    """
    raw = list(sys.argv[1:] if argv is None else argv)
    arguments = _arguments(raw)
    environment = dict(os.environ)
    environment[_LIMIT_ENVIRONMENT] = str(arguments.memory_limit_mb)
    environment[_DEVICE_ENVIRONMENT] = arguments.device
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # The child's output is relayed as it comes: a caller that stops this
    # (device_check.sh's budget) still has what ran.
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, *raw],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as child:
        timer = threading.Timer(arguments.timeout, child.kill)
        timer.start()
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
        code = child.wait()
        timed_out = not timer.is_alive()
        timer.cancel()
    if timed_out:
        print(f"--gpu-host-table: stopped after --timeout {arguments.timeout} s")
        code = 124
    found = None
    for line in lines:
        if line.startswith(JSON_PREFIX):
            found = json.loads(line[len(JSON_PREFIX) :])
    if found is not None and arguments.json:
        with open(arguments.json, "w") as out:
            json.dump(found, out, indent=1)
    if code != 0:
        raise SystemExit(code if code in (1, 2, 124) else 1)
    return found


def child_main(argv: Sequence[str]) -> None:
    """The fresh process's part (the memory limit already set): measures and
    prints the findings' JSON line; exits 1 when the frozen rows changed."""
    arguments = _arguments(argv)
    on_gpu = tf.DeviceSpec.from_string(arguments.device).device_type == "GPU"
    gpus = tf.config.list_physical_devices("GPU")
    if on_gpu and not gpus:
        print("TensorFlow sees no GPU: nothing to measure (--device /CPU:0 tries it on the CPU)")
        raise SystemExit(2)
    if on_gpu:
        configured = tf.config.get_logical_device_configuration(gpus[0]) or []
        print(f"GPU memory TensorFlow may use: {[c.memory_limit for c in configured]} MB")
    found = measure(arguments, on_gpu)
    _print_lines(found)
    print(JSON_PREFIX + json.dumps(found))
    sys.stdout.flush()
    if not found["frozen_bit_for_bit"]["met"]:
        raise SystemExit(1)


def _print_lines(found: dict[str, Any]) -> None:
    """The findings, one line each, with their targets."""

    def verdict(entry: dict[str, Any]) -> str:
        return "met" if entry["met"] else "NOT met"

    table, step_ms = found["table"], found["step_ms"]
    print(
        f"table {table['rows']:,} x {table['width']} ({table['bytes'] / 2**20:,.0f} MiB,"
        f" {table['over_limit']}x the {found['memory_limit_mb']} MiB limit),"
        f" frozen_rows_on='host', on {found['device']}"
    )
    print(
        f"  step: host table {step_ms['host']:.3f} ms, a table that fits"
        f" {step_ms['fits']:.3f} ms, keras.layers.Embedding + Adam on /CPU:0"
        f" {step_ms['stock_cpu']:.3f} ms"
    )
    print(f"  frozen rows bit for bit: {verdict(found['frozen_bit_for_bit'])}")
    ratio = found["host_over_fits"]
    print(
        f"  host / fits: {ratio['ratio']}x (target <= {ratio['target_at_most']}x): {verdict(ratio)}"
    )
    ratio = found["stock_cpu_over_host"]
    print(
        f"  stock on the CPU / host: {ratio['ratio']}x (target >= {ratio['target_at_least']}x):"
        f" {verdict(ratio)}"
    )
    if found["note"]:
        print(f"NOTE: {found['note']}")


def _median_steps(
    steps: Mapping[str, tuple[Callable, Sequence[tuple[Any, Any]]]], rounds: int
) -> dict[str, float]:
    """Median milliseconds per step of each (step, its batches), in
    interleaved rounds."""
    for step, batches in steps.values():
        float(step(*batches[0]))  # trace and warm up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (step, batches) in steps.items():
            start = time.perf_counter()
            for ids, targets in batches:
                loss = step(ids, targets)
            float(loss)  # waits for the device
            times[name].append((time.perf_counter() - start) / len(batches) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def _ours(
    rows: int, frozen_rows_on: str, arguments: argparse.Namespace, rng: np.random.Generator
) -> tuple[Callable, Any, list[Any]]:
    """Our step (``PartialEmbedding``, 1 % of rows permitted, masked Adam),
    its layer and what it keeps alive."""
    permitted = np.sort(rng.choice(rows, size=max(1, rows // 100), replace=False))
    with tf.device(arguments.device):
        layer = pe.PartialEmbedding(
            rows, arguments.width, trainable_ids=permitted, frozen_rows_on=frozen_rows_on
        )
        model = pooled_model(layer, arguments.ids_per_sample)
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam())
        return keras_step(model, optimizer), layer, [model, optimizer]


def _stock_on_cpu(rows: int, arguments: argparse.Namespace) -> tuple[Callable, Any, list[Any]]:
    """The stock step: ``keras.layers.Embedding`` built on the CPU (Adam's
    slots follow it there), the head on the compute device."""
    with tf.device("/CPU:0"):
        embedding = keras.layers.Embedding(rows, arguments.width)
        embedding.build((None, arguments.ids_per_sample))
    with tf.device(arguments.device):
        model = pooled_model(embedding, arguments.ids_per_sample)
        optimizer = keras.optimizers.Adam()
        return keras_step(model, optimizer), embedding, [model, optimizer]


def _batches(
    rows: int, arguments: argparse.Namespace, rng: np.random.Generator
) -> list[tuple[Any, Any]]:
    with tf.device(arguments.device):
        return [
            (
                tf.constant(
                    rng.integers(0, rows, size=(arguments.batch, arguments.ids_per_sample)),
                    tf.int32,
                ),
                tf.constant(rng.normal(size=(arguments.batch, 1)), tf.float32),
            )
            for _ in range(arguments.steps)
        ]


def measure(arguments: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """Builds the three models, times their steps and checks the frozen table."""
    limit_bytes = arguments.memory_limit_mb * 2**20
    row_bytes = arguments.width * 4
    host_rows = TABLE_OVER_LIMIT * limit_bytes // row_bytes
    fits_rows = int(FITS_OVER_LIMIT * limit_bytes) // row_bytes
    rng = np.random.default_rng(arguments.seed)
    host_step, host_layer, host_keep = _ours(host_rows, "host", arguments, rng)
    frozen_before = np.array(host_layer.embeddings.numpy(), copy=True)
    store_before = np.array(host_layer.float_rows.numpy(), copy=True)
    fits_step, _, fits_keep = _ours(fits_rows, "device", arguments, rng)
    stock_step, stock_embedding, stock_keep = _stock_on_cpu(host_rows, arguments)
    batches = _batches(host_rows, arguments, rng)
    # The fitting table has fewer rows: its ids wrap into them.
    fits_batches = [(tf.math.floormod(ids, fits_rows), targets) for ids, targets in batches]
    medians = _median_steps(
        {
            "host": (host_step, batches),
            "fits": (fits_step, fits_batches),
            "stock_cpu": (stock_step, batches),
        },
        arguments.rounds,
    )
    frozen_kept = bool(
        np.array_equal(host_layer.embeddings.numpy().view(np.uint32), frozen_before.view(np.uint32))
    )
    store_moved = bool(np.any(host_layer.float_rows.numpy() != store_before))
    gpu_memory = None
    if on_gpu:
        info = tf.config.experimental.get_memory_info("GPU:0")
        gpu_memory = {"current_bytes": int(info["current"]), "peak_bytes": int(info["peak"])}
    placement = {
        "frozen_table": host_layer.embeddings.value.device,
        "trained_rows": host_layer.float_rows.value.device,
        "stock_table": stock_embedding.embeddings.value.device,
    }
    del host_keep, fits_keep, stock_keep
    return _findings(arguments, on_gpu, (host_rows, fits_rows), medians, frozen_kept) | {
        "gpu_memory": gpu_memory,
        "placement": placement,
        "trained_rows_moved": store_moved,
    }


def _findings(
    arguments: argparse.Namespace,
    on_gpu: bool,
    rows: tuple[int, int],
    medians: dict[str, float],
    frozen_kept: bool,
) -> dict[str, Any]:
    """The findings' JSON object, every figure with its target."""
    host_rows, fits_rows = rows
    width, device = arguments.width, arguments.device
    row_bytes = width * 4
    host_over_fits = medians["host"] / medians["fits"]
    stock_over_host = medians["stock_cpu"] / medians["host"]
    return {
        "device": device,
        "gpu_figures": on_gpu,
        "note": None
        if on_gpu
        else "run on the CPU with a pretend memory limit (none set): not GPU figures",
        "memory_limit_mb": arguments.memory_limit_mb,
        "memory_limit_set": on_gpu,
        "table": {
            "rows": int(host_rows),
            "width": width,
            "bytes": int(host_rows * row_bytes),
            "over_limit": TABLE_OVER_LIMIT,
        },
        "fits_table": {"rows": int(fits_rows), "bytes": int(fits_rows * row_bytes)},
        "batch": arguments.batch,
        "ids_per_sample": arguments.ids_per_sample,
        "permitted_fraction": 0.01,
        "rounds": arguments.rounds,
        "steps_per_round": arguments.steps,
        "jit_compile": False,
        "step_ms": {name: round(ms, 4) for name, ms in medians.items()},
        "frozen_bit_for_bit": {"met": frozen_kept, "rows_compared": int(host_rows)},
        "host_over_fits": {
            "ratio": round(host_over_fits, 3),
            "target_at_most": HOST_OVER_FITS_TARGET,
            "met": host_over_fits <= HOST_OVER_FITS_TARGET,
        },
        "stock_cpu_over_host": {
            "ratio": round(stock_over_host, 3),
            "target_at_least": STOCK_OVER_HOST_TARGET,
            "met": stock_over_host >= STOCK_OVER_HOST_TARGET,
        },
    }


if __name__ == "__main__":
    main()
