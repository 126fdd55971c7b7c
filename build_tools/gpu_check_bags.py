"""gpu_check.py's checks of the bag gradient (MaskedEmbeddingBagGrad's core).

Through any back end of gpu_check.py: the bag gradient (rows ascending on a
GPU, in order of first occurrence on the CPU) against a float64 NumPy
reference on fresh random bags (every value dtype and index type, pruned and
frozen ids, duplicates within and across bags, a hot row whose run spans many
positions), twice bit-identical, an id out of range refused with its bag and
position, zero sizes; where the back end runs CPU kernels, the forward pass
too (it has no GPU kernel). On a GPU through the module, then a timing table.
"""

from __future__ import annotations

import numpy as np

import gpu_check_common as common


def _compute_dtype(value_dtype):
    return np.float64 if value_dtype == "float64" else np.float32


class BagProblem:
    """Host arrays of one gradient: bags' gradient, ids, bags, factors, mask."""

    def __init__(self, rng, value_dtype, index_dtype, num_rows, row_size, num_bags, length, hot):
        self.value_dtype = value_dtype
        self.num_rows = num_rows
        lengths = rng.integers(0, 2 * length + 1, size=num_bags)
        self.bags = np.repeat(np.arange(num_bags), lengths).astype(np.int64)
        n = self.bags.size
        self.ids = rng.integers(0, num_rows, size=n)
        self.ids[rng.random(n) < 0.1] = -1  # Pruned.
        self.ids[rng.random(n) < hot] = num_rows // 2  # A hot row.
        self.ids = self.ids.astype(index_dtype)
        self.grad = common.from_float(rng.standard_normal((num_bags, row_size)), value_dtype)
        self.factors = rng.uniform(-1.0, 1.0, size=n).astype(_compute_dtype(value_dtype))
        self.row_mask = rng.random(num_rows) < 0.6
        self.row_mask[num_rows // 2] = True

    def expected(self):
        """(rows ascending, float64 values, per-element bound)."""
        keep = (self.ids >= 0) & self.row_mask[np.maximum(self.ids, 0)]
        grad = common.to_float64(self.grad, self.value_dtype)
        terms = self.factors[keep].astype(np.float64)[:, None] * grad[self.bags[keep]]
        rows = np.unique(self.ids[keep].astype(np.int64))
        dense = np.zeros((self.num_rows, grad.shape[1]))
        magnitude = np.zeros_like(dense)
        np.add.at(dense, self.ids[keep], terms)
        np.add.at(magnitude, self.ids[keep], np.abs(terms))
        counts = np.bincount(self.ids[keep], minlength=self.num_rows).astype(np.float64)
        compute = common.UNIT_ROUNDOFF["float64" if self.value_dtype == "float64" else "float32"]
        # Each product and addition rounds in the compute type, the row once
        # in its dtype; 2**-24 covers float16's subnormal spacing.
        bound = (counts[:, None] + 1) * compute * magnitude + common.UNIT_ROUNDOFF[
            self.value_dtype
        ] * np.abs(dense)
        if self.value_dtype == "float16":
            bound += 2.0**-24
        return rows, dense[rows], bound[rows]


def _compare(failures, name, problem, rows, values, ascending):
    want_rows, want_values, bound = problem.expected()
    if not ascending:  # The CPU's first-occurrence order.
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], values[order]
    failures.check(
        np.array_equal(np.asarray(rows, np.int64), want_rows),
        f"{name}: rows are not the distinct permitted ids",
    )
    if len(rows) != len(want_rows):
        return
    error = np.abs(common.to_float64(values, problem.value_dtype) - want_values)
    bad = ~(error <= bound)
    if bad.any():
        where = tuple(np.argwhere(bad)[0])
        failures.check(
            False, f"{name}: element {where} off by {error[where]:.3g} (bound {bound[where]:.3g})"
        )
    else:
        failures.check(True, "")


def bag_checks(backend, rng, failures, quick: bool) -> None:
    """The bag gradient on ``backend`` against the reference; the forward
    pass too on the CPU."""
    missing = backend.lacks("masked_embedding_bag_grad")
    if missing:
        failures.check(False, missing)
        return
    shapes = [  # (rows, row size, bags, mean length, hot share)
        (37, 5, 11, 3, 0.0),
        (200, 64, 64, 8, 0.0),
        (500, 300, 40, 20, 0.5),  # Wide rows; a hot row over many positions.
    ]
    if not quick:
        shapes.append((100_000, 128, 2048, 32, 0.05))
    ascending = backend.bag_rows_ascending
    for value_dtype in common.VALUE_DTYPES:
        for index_dtype in common.INDEX_DTYPES:
            for rows, row_size, num_bags, length, hot in shapes:
                problem = BagProblem(
                    rng, value_dtype, index_dtype, rows, row_size, num_bags, length, hot
                )
                name = (
                    f"{backend.name} bag gradient {value_dtype} {np.dtype(index_dtype).name} "
                    f"V={rows} D={row_size} ids={problem.ids.size}"
                )
                first = backend.bag_gradient(problem)
                _compare(failures, name, problem, *first, ascending)
                second = backend.bag_gradient(problem)
                failures.check(
                    all(
                        np.array_equal(a.view(np.uint8), b.view(np.uint8))
                        for a, b in zip(first, second)
                    ),
                    f"{name}: two runs differ",
                )
            _bad_id(backend, failures, rng, value_dtype, index_dtype)
    _empty(backend, failures)
    if backend.checks_bag_forward:
        _forward_checks(backend, rng, failures)


def _bad_id(backend, failures, rng, value_dtype, index_dtype):
    problem = BagProblem(rng, value_dtype, index_dtype, 64, 8, 6, 4, 0.0)
    problem.bags = np.array([0, 0, 2, 2, 2, 5], np.int64)
    problem.ids = np.array([1, -1, 3, 4, 64, 2], index_dtype)
    problem.factors = np.ones(6, _compute_dtype(value_dtype))
    name = f"{backend.name} bag gradient {value_dtype} {np.dtype(index_dtype).name} out of range"
    try:
        backend.bag_gradient(problem)
        failures.check(False, f"{name}: no IndexError")
    except backend.refusal(IndexError) as error:
        message = backend.message(error)
        failures.check(
            "sp_ids: bag 2, position 2 = 64 is not in [0, 64)" in message,
            f"{name}: wrong message {message}",
        )


def _empty(backend, failures):
    """No ids, no bags, empty rows: no rows out, no device error."""
    for value_dtype in common.VALUE_DTYPES:
        for num_bags, row_size, num_ids in ((3, 4, 0), (0, 4, 0), (3, 0, 5)):
            problem = BagProblem(
                np.random.default_rng(0), value_dtype, np.int64, 8, row_size, 3, 1, 0.0
            )
            problem.grad = common.from_float(np.ones((num_bags, row_size)), value_dtype)
            problem.bags = np.zeros(num_ids, np.int64)
            problem.ids = np.arange(num_ids, dtype=np.int64) % 8
            problem.factors = np.ones(num_ids, _compute_dtype(value_dtype))
            name = (
                f"{backend.name} bag gradient {value_dtype} "
                f"bags={num_bags} D={row_size} ids={num_ids}"
            )
            try:
                rows, values = backend.bag_gradient(problem)
                want_rows, _, _ = problem.expected()
                failures.check(
                    len(rows) == len(want_rows) and values.shape[0] == len(want_rows),
                    f"{name}: {len(rows)} rows",
                )
            except Exception as error:  # noqa: BLE001 - any error is a failure here.
                failures.check(False, f"{name}: raised {type(error).__name__}: {error}")


def _forward_checks(backend, rng, failures):
    """The forward pass against the float64 reference (CPU only: it has no
    GPU kernel; GPU tables use stock ops for it)."""
    for value_dtype in common.VALUE_DTYPES:
        for combiner in ("sum", "mean", "sqrtn"):
            problem = BagProblem(rng, value_dtype, np.int32, 50, 7, 9, 4, 0.2)
            params = common.from_float(rng.standard_normal((50, 7)), value_dtype)
            weights = rng.uniform(0.25, 2.0, size=problem.ids.size).astype(
                _compute_dtype(value_dtype)
            )
            out, factors = backend.embedding_bag(
                params, problem.ids, problem.bags, 9, weights, combiner, value_dtype
            )
            kept = problem.ids >= 0
            w = np.where(kept, weights.astype(np.float64), 0.0)
            sums = np.bincount(
                problem.bags, weights=w if combiner != "sqrtn" else w**2, minlength=9
            )
            if combiner == "sqrtn":
                sums = np.sqrt(sums)
            scale = (
                np.ones(9)
                if combiner == "sum"
                else np.divide(1.0, sums, out=np.zeros(9), where=sums > 0)
            )
            terms = (w * scale[problem.bags])[:, None] * common.to_float64(params, value_dtype)[
                np.maximum(problem.ids, 0)
            ]
            expected = np.zeros((9, 7))
            magnitude = np.zeros((9, 7))
            np.add.at(expected, problem.bags, terms)
            np.add.at(magnitude, problem.bags, np.abs(terms))
            longest = np.bincount(problem.bags, minlength=9).max()
            compute = common.UNIT_ROUNDOFF["float64" if value_dtype == "float64" else "float32"]
            bound = (2 * longest + 4) * compute * magnitude + common.UNIT_ROUNDOFF[
                value_dtype
            ] * np.abs(expected)
            if value_dtype == "float16":
                bound += 2.0**-24
            error = np.abs(common.to_float64(out, value_dtype) - expected)
            failures.check(
                bool(np.all(error <= bound)),
                f"{backend.name} bag forward {value_dtype} {combiner}: off by {error.max():.3g}",
            )
            failures.check(
                bool(np.all(factors[~kept] == 0)),
                f"{backend.name} bag forward {value_dtype}: pruned factor",
            )


def bag_timing(backend, rng, quick: bool, copy_gbps: float) -> list[str]:
    """Milliseconds of the GPU bag gradient (both calls) for a few sizes, and
    the bytes it moves against the device-to-device copy."""
    cases = [  # (rows, row size, bags, ids a bag)
        (1 << 20, 128, 4096, 16),
        (1 << 23, 128, 16384, 32),
        (1 << 20, 128, 256, 256),
    ]
    if quick:
        cases = cases[:1]
    lines = [
        f"{'bag gradient':14} {'rows':>9} {'D':>4} {'bags':>6} {'ids':>8} {'ms':>8} "
        f"{'GB/s':>7} {'of copy':>7}"
    ]
    for rows, row_size, num_bags, length in cases:
        n = num_bags * length
        grad = backend.to_device(rng.standard_normal((num_bags, row_size)).astype(np.float32))
        ids = backend.to_device(rng.integers(0, rows, n).astype(np.int32))
        bags = backend.to_device(np.repeat(np.arange(num_bags), length).astype(np.int64))
        factors = backend.to_device(np.full(n, 1.0 / length, np.float32))
        mask = backend.to_device(np.ones(rows, bool))
        out_rows = backend.empty((n,), np.int32)
        values = backend.empty((n, row_size), np.float32)
        ms = backend.kernels.time_masked_embedding_bag_grad_gpu(
            grad, ids, bags, factors, mask, out_rows, values, warmup=2, repeats=10
        )
        # Reads ids, bags, factors and a grad row per id; writes a row per id at most.
        moved = n * (4 + 8 + 4) + 2 * n * row_size * 4
        gbps = moved / ms / 1e6
        lines.append(
            f"{'float32':14} {rows:9d} {row_size:4d} {num_bags:6d} {n:8d} {ms:8.3f} "
            f"{gbps:7.0f} {gbps / copy_gbps:7.1%}"
        )
        print(lines[-1], flush=True)
    return lines
