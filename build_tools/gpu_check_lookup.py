"""The quantized lookup (QuantizedLookup's core) in the GPU check.

On fresh random inputs, for both id types: the rows and store rows bit for bit
against NumPy (a float store row where an id has one, else
``float32(int8) / scale``, one IEEE division, as Keras dequantizes) and, on a
GPU, against the CPU kernel; an id out of range and a corrupt store index
refused with the CPU kernel's error and message, the outputs left as they
were. The GPU run is timed against reading the batch's int8 rows and writing
its float rows at the copy bandwidth.
"""

from __future__ import annotations

import numpy as np

from gpu_check_common import INDEX_DTYPES, Failures, bits_equal


class LookupProblem:
    """A quantized table of V rows, S - 1 of them trained (with the sentinel
    store row last), and N ids, some of them trained rows."""

    def __init__(self, rng, index_dtype, num_rows=500, width=37, store_rows=41, num_ids=900):
        self.codes = rng.integers(-127, 128, size=(num_rows, width)).astype(np.int8)
        self.scales = rng.uniform(0.5, 200.0, size=num_rows).astype(np.float32)
        trained = rng.choice(num_rows, size=store_rows - 1, replace=False)
        self.sorted_ids = np.append(np.sort(trained), num_rows).astype(np.int32)
        self.store_index = np.append(rng.permutation(store_rows - 1), store_rows - 1).astype(
            np.int32
        )
        self.store = rng.standard_normal((store_rows, width)).astype(np.float32)
        ids = rng.integers(0, num_rows, size=num_ids)
        ids[rng.random(num_ids) < 0.3] = rng.choice(trained, size=1)[0]
        self.ids = ids.astype(index_dtype)

    def arrays(self):
        return (self.codes, self.scales, self.store, self.sorted_ids, self.store_index, self.ids)

    def expected(self):
        sentinel = len(self.sorted_ids) - 1
        position = np.minimum(np.searchsorted(self.sorted_ids, self.ids), sentinel)
        found = self.sorted_ids[position] == self.ids
        row_of = np.where(found, self.store_index[position], sentinel).astype(np.int32)
        rows = self.codes[self.ids].astype(np.float32) / self.scales[self.ids][:, None]
        rows[found] = self.store[row_of[found]]
        return rows, row_of

    def outputs(self):
        width = self.codes.shape[1]
        return np.full((len(self.ids), width), -7.0, np.float32), np.full(
            len(self.ids), -7, np.int32
        )


def lookup_checks(backend, rng, failures: Failures) -> None:
    missing = backend.lacks("quantized_lookup")
    if missing:
        failures.check(False, missing)
        return
    for index_dtype in INDEX_DTYPES:
        for shape in ({}, {"width": 128, "num_rows": 3000, "num_ids": 20000}):
            problem = LookupProblem(rng, index_dtype, **shape)
            name = (
                f"{backend.name} quantized lookup {np.dtype(index_dtype).name} "
                f"D={problem.codes.shape[1]} N={len(problem.ids)}"
            )
            want_rows, want_row_of = problem.expected()
            out, row_of = problem.outputs()
            backend.quantized_lookup(problem.arrays(), out, row_of)
            failures.check(bits_equal(out, want_rows), f"{name}: rows differ from NumPy")
            failures.check(bits_equal(row_of, want_row_of), f"{name}: store rows differ")
        problem = LookupProblem(rng, index_dtype)
        bad_ids = problem.ids.copy()
        bad_ids[[7, 11]] = [problem.codes.shape[0], -1]
        bad_index = problem.store_index.copy()
        bad_index[3] = len(bad_index)
        for broken, arrays, error_type in (
            ("id out of range", (*problem.arrays()[:5], bad_ids), IndexError),
            (
                "store index out of range",
                (*problem.arrays()[:4], bad_index, problem.ids),
                ValueError,
            ),
        ):
            name = f"{backend.name} quantized lookup {np.dtype(index_dtype).name} {broken}"
            refused = backend.refusal(error_type)
            expected_message = None
            try:
                backend.quantized_lookup(arrays, *problem.outputs(), reference=True)
            except refused as error:
                expected_message = backend.message(error)
            failures.check(expected_message is not None, f"{name}: the CPU kernel accepted it")
            out, row_of = problem.outputs()
            try:
                backend.quantized_lookup(arrays, out, row_of)
                failures.check(False, f"{name}: no {refused.__name__}")
            except refused as error:
                message = backend.message(error)
                failures.check(
                    message == expected_message, f"{name}: {message} != {expected_message}"
                )
            untouched_out, untouched_row_of = problem.outputs()
            failures.check(
                bits_equal(out, untouched_out) and bits_equal(row_of, untouched_row_of),
                f"{name}: outputs written",
            )


def lookup_timing(backend, rng, copy_gbps: float) -> str:
    """One line: 65,536 ids of a 1M x 128 int8 table, against the floor."""
    num_rows, width, num_ids = 1 << 20, 128, 1 << 16
    codes = backend.empty((num_rows, width), np.int8)
    scales = backend.to_device(np.full(num_rows, 3.0, np.float32))
    store_rows = 4097
    problem_store = backend.to_device(np.zeros((store_rows, width), np.float32))
    trained = np.sort(rng.choice(num_rows, size=store_rows - 1, replace=False))
    sorted_ids = backend.to_device(np.append(trained, num_rows).astype(np.int32))
    store_index = backend.to_device(np.arange(store_rows, dtype=np.int32))
    ids = backend.to_device(rng.integers(0, num_rows, size=num_ids).astype(np.int32))
    out = backend.empty((num_ids, width), np.float32)
    row_of = backend.empty((num_ids,), np.int32)
    if backend.cupy is not None:
        codes.fill(1)
    else:
        codes.fill_(1)
    ms = backend.kernels.quantized_lookup_gpu(
        codes,
        scales,
        problem_store,
        sorted_ids,
        store_index,
        ids,
        out,
        row_of,
        warmup=2,
        repeats=10,
    )
    floor_ms = num_ids * (width * 5 + 8) / copy_gbps / 1e6
    return (
        f"quantized lookup: {num_ids} ids of a {num_rows} x {width} int8 table: {ms:.3f} ms, "
        f"floor {floor_ms:.3f} ms ({ms / floor_ms:.1f}x)"
    )
