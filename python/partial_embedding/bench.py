"""Kernel microbenchmarks: ``python -m partial_embedding.bench``.

Times ``masked_scatter_sub`` against TensorFlow's built-in alternatives in the
same run, on the same inputs, and prints ratios (absolute times drift on busy
machines; ratios measured side by side do not).

Methods, each updating a [V, D] float32 table with k rows of updates:
  masked_scatter_sub      this library's in-place kernel
  scatter_sub             ``tf.Variable.scatter_sub`` (no mask; the built-in
                          sparse update, which also flips the variable into
                          copy-on-read mode)
  tensor_scatter_nd_sub   ``var.assign(tf.tensor_scatter_nd_sub(var, ...))``
  dense_mask              the gradient-masking workaround's update:
                          ``var.assign_sub(mask[:, None] * dense_update)``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from partial_embedding.ops import masked_scatter_sub

ALL_METHODS = ("masked_scatter_sub", "scatter_sub", "tensor_scatter_nd_sub", "dense_mask")


@dataclass
class OpCase:
    """One point of the op benchmark grid."""

    num_rows: int = 1_000_000
    width: int = 128
    num_indices: int = 4096
    duplicate_rate: float = 0.0
    permitted_fraction: float = 1.0
    dtype: str = "float32"


def _make_inputs(case: OpCase, seed: int) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(seed)
    distinct = max(1, int(round(case.num_indices * (1.0 - case.duplicate_rate))))
    pool = rng.choice(case.num_rows, size=min(distinct, case.num_rows), replace=False)
    indices = rng.choice(pool, size=case.num_indices)
    mask = rng.random(case.num_rows) < case.permitted_fraction
    updates = rng.standard_normal((case.num_indices, case.width), dtype=np.float32)
    return {
        "indices": tf.constant(indices, tf.int64),
        "updates": tf.constant(updates, case.dtype),
        "row_mask": tf.constant(mask),
    }


def _method_step(method: str, table: tf.Variable, inputs: dict[str, tf.Tensor]) -> Callable[[], None]:
    indices, updates, row_mask = inputs["indices"], inputs["updates"], inputs["row_mask"]

    if method == "masked_scatter_sub":

        @tf.function
        def step() -> None:
            masked_scatter_sub(table, indices, updates, row_mask)

    elif method == "scatter_sub":
        slices = tf.IndexedSlices(updates, indices, tf.shape(table, out_type=tf.int64))

        @tf.function
        def step() -> None:
            table.scatter_sub(slices)

    elif method == "tensor_scatter_nd_sub":

        @tf.function
        def step() -> None:
            table.assign(tf.tensor_scatter_nd_sub(table, indices[:, None], updates))

    elif method == "dense_mask":

        @tf.function
        def step() -> None:
            dense = tf.scatter_nd(indices[:, None], updates, tf.shape(table, out_type=tf.int64))
            table.assign_sub(tf.cast(row_mask, table.dtype)[:, None] * dense)

    else:
        raise ValueError(f"method: unknown method {method!r}; choose from {ALL_METHODS}")
    return step


def time_op_case(
    case: OpCase, methods: tuple[str, ...] = ("masked_scatter_sub", "scatter_sub"), repeats: int = 50, rounds: int = 5, seed: int = 0
) -> dict[str, float]:
    """Median seconds per step of each method, measured interleaved in rounds.

    Each method updates its own copy of the table, so the built-in scatter's
    switch into copy-on-read mode cannot slow the others down.
    """
    inputs = _make_inputs(case, seed)
    initial = tf.random.stateless_normal([case.num_rows, case.width], seed=[seed, 1], dtype=case.dtype)
    steps = {}
    for method in methods:
        table = tf.Variable(initial)
        steps[method] = _method_step(method, table, inputs)
        steps[method]()  # trace and warm up
    samples: dict[str, list[float]] = {method: [] for method in methods}
    for _ in range(rounds):
        for method in methods:
            step = steps[method]
            start = time.perf_counter()
            for _ in range(repeats):
                step()
            samples[method].append((time.perf_counter() - start) / repeats)
    return {method: statistics.median(values) for method, values in samples.items()}


def run_op_benchmark(cases: list[OpCase], methods: tuple[str, ...], repeats: int, rounds: int) -> list[dict]:
    """Times every case, prints a table with ratios, returns the rows."""
    rows = []
    header = f"{'V':>9} {'D':>4} {'k':>6} {'dup':>4} {'perm':>4} " + " ".join(f"{m:>22}" for m in methods)
    print(header)
    for case in cases:
        seconds = time_op_case(case, methods, repeats, rounds)
        base = seconds["masked_scatter_sub"]
        cells = []
        for method in methods:
            ratio = base / seconds[method]
            cells.append(f"{seconds[method] * 1e3:9.3f}ms ({ratio:5.2f}x)")
        print(
            f"{case.num_rows:>9} {case.width:>4} {case.num_indices:>6} {case.duplicate_rate:>4.2f} "
            f"{case.permitted_fraction:>4.2f} " + " ".join(f"{c:>22}" for c in cells)
        )
        rows.append({**asdict(case), "seconds": seconds, "ratio_vs": {m: base / seconds[m] for m in methods}})
    print("(x) = masked_scatter_sub time / method time: below 1.0 means masked_scatter_sub is faster")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000], help="vocabulary sizes V")
    parser.add_argument("--width", type=int, nargs="+", default=[128], help="row widths D")
    parser.add_argument("--indices", type=int, nargs="+", default=[4096], help="indices per update k")
    parser.add_argument("--duplicate-rate", type=float, nargs="+", default=[0.0])
    parser.add_argument("--permitted", type=float, nargs="+", default=[1.0], help="fraction of rows permitted")
    parser.add_argument("--methods", nargs="+", default=["masked_scatter_sub", "scatter_sub"], choices=ALL_METHODS)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    methods = tuple(dict.fromkeys(["masked_scatter_sub", *args.methods]))
    cases = [
        OpCase(v, d, k, dup, perm)
        for v in args.rows
        for d in args.width
        for k in args.indices
        for dup in args.duplicate_rate
        for perm in args.permitted
    ]
    print(f"TensorFlow {tf.__version__}, {tf.config.threading.get_intra_op_parallelism_threads() or 'default'} intra-op threads")
    rows = run_op_benchmark(cases, methods, args.repeats, args.rounds)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"op": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
