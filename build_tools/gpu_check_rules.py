"""Every rule of the fused optimizer table (MaskedSparseApplyRule's core) in the GPU check.

The rules are the kernel module's ``RULES`` (cc/core/row_rules.h). Each one
runs on fresh random inputs with duplicates, frozen rows and one row hotter
than a GPU piece, on every value dtype; the index type and the slot layout
(full-size or compact) rotate over the dtypes, so each rule meets both index
types and both layouts, and so does each dtype. The row shapes rotate too:
narrow rows (one element a lane), 16-byte rows, and rows wider than one pass
of a warp.

* The reference is the CPU kernel. The GPU sums a row's gradient rows in
  pieces of ``RULE_GPU_PIECE_SIZE`` occurrences (cc/core/masked_sparse_apply_gpu.h):
  the CPU kernel run on the same step with each hotter row's occurrences
  replaced by its pieces' sums (``regrouped``, summed here as the kernel
  rounds) adds them as the GPU does. Then
  - an element-wise rule gives every table bit for bit;
  - a row-wise rule gives its element-wise slots bit for bit, and var and its
    per-row slot within ``rowwise_bound`` of the CPU (the row's sum of g * g is
    added in another order on the GPU); untouched rows bit for bit.
* Frozen and unindexed rows, and their slot rows, keep their bits.
* Each run repeated from the same inputs: bit-identical.
* Refusals (an index or slot index out of range, a row given two slot rows,
  two rows given one): the same error and message as the CPU kernel, and no
  table written.
* FTRL's var and linear within ``ftrl_bound`` of the CPU where its exponent
  takes pow (CUDA's powf and glibc's pow differ in the last bits); bit for
  bit where it does not (0.5, 0, 1).
* A larger Zipf batch with rows thousands of times hot, wide and narrow rows,
  an element-wise and a row-wise rule (and, outside --quick, FTRL).

Timing (GPU only): the Adam rule at D = 128, float32, against the memory floor
(the table, m and v rows read and written plus the gradient read, at the
measured copy bandwidth), PyTorch's ``SparseAdam`` and the same lazy Adam in
stock PyTorch ops (unique, ``index_add_`` segment sum, three gathers, three
scatters), when torch imports; then every rule at one size against its own
floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from gpu_check_common import (
    INDEX_DTYPES,
    UNIT_ROUNDOFF,
    VALUE_DTYPES,
    Failures,
    bits_equal,
    from_float,
    round_to,
    to_float64,
)

# Each hyperparameter of the table by name. float32 values in every dtype:
# then 1 - (1 - x) is x, for a front end that takes beta and computes 1 - beta.
HYPERPARAMETERS = {
    "learning_rate": 0.01,
    "weight_decay": 0.004,
    "momentum": 0.9,
    "epsilon": 1e-3,
    "rho": 0.9,
    "one_minus_rho": 0.1,
    "one_minus_beta_1": 0.1,
    "one_minus_beta_2": 0.001,
    "alpha": 0.0123,
    "one_minus_beta_1_power": 0.271,
    "one_minus_beta_2_power": 0.002997,
    # FTRL: an exponent (-learning_rate_power) that takes pow (0.5, 0 and 1
    # do not: cc/core/row_rules.h FtrlPower), so ftrl_bound is what is checked.
    "l1": 0.01,
    "two_l2_shrinkage": 0.02,
    "two_l2": 0.05,
    "power": 0.75,
}
# pow's error in ulps of the compute type: CUDA's powf (pow within 2 for
# double) and glibc's pow (within 1), the two FTRL's var and linear may differ by.
GPU_POW_ULPS = 4
CPU_POW_ULPS = 1
# FTRL's exponents that take no pow (FtrlPower): bit for bit on either side.
EXACT_FTRL_POWERS = (0.5, 0.0, 1.0)
# Row shapes after the first dimension: 18 elements (one a lane), 72 (16-byte
# rows in every dtype), 37 (two passes of a warp, one element a lane) and 160
# (16-byte rows, two or three passes but in 16-bit types).
ROW_SHAPES = ((2, 9), (3, 24), (1, 37), (2, 80))
SAME = object()  # "The problem's own" for an optional argument that may be None.


def rule_hyperparameters(names, value_dtype: str, weight_decay: bool) -> list[float]:
    """The values of the hyperparameters ``names`` (weight_decay 0 without
    ``weight_decay``), each rounded to float32, then to ``value_dtype``."""
    return [
        float(round_to(round_to(np.array([value]), "float32"), value_dtype)[0])
        for value in (
            HYPERPARAMETERS[name] if name != "weight_decay" or weight_decay else 0.0
            for name in names
        )
    ]


def rule_cases(rules: dict) -> list[tuple]:
    """(rule, value dtype, index dtype, compact, weight decay, row shape) for
    every rule and dtype, the rest rotating (see the module's docstring)."""
    cases = []
    for r, rule in enumerate(rules):
        for d, value_dtype in enumerate(VALUE_DTYPES):
            combo = (r + d) % 4
            compact = combo >= 2 and len(rules[rule]["slots"]) > 0
            shape = ROW_SHAPES[(d + r // 4) % len(ROW_SHAPES)]
            cases.append((rule, value_dtype, INDEX_DTYPES[combo % 2], compact, (r + d) % 2, shape))
    return cases


# --- the model of the GPU's sums ------------------------------------------------------


def summed_gradient(rows: np.ndarray, value_dtype: str, piece_size: int | None) -> np.ndarray:
    """One row's gradient sum from its gradient rows in position order.

    In position order from zero, rounding after each addition; with
    ``piece_size``, each run of ``piece_size`` occurrences so, then the
    pieces' sums so (one piece: the same as without).
    """

    def in_order(values: np.ndarray) -> np.ndarray:
        total = np.zeros(values.shape[1:])
        for value in values:
            total = round_to(total + value, value_dtype)
        return total

    if piece_size is None or len(rows) <= piece_size:
        return in_order(rows)
    pieces = [in_order(rows[k : k + piece_size]) for k in range(0, len(rows), piece_size)]
    return in_order(np.stack(pieces))


def check_model(rng, failures: Failures) -> None:
    """The model's pieces: one piece is the sum in position order; exact
    (dyadic) values give the same sum in any grouping."""
    rows = rng.standard_normal((77, 3))
    failures.check(
        bits_equal(summed_gradient(rows, "float32", 77), summed_gradient(rows, "float32", None)),
        "model: one piece differs from the sum in position order",
    )
    dyadic = rng.integers(-64, 64, size=(77, 3)) / 8.0
    failures.check(
        bits_equal(summed_gradient(dyadic, "float32", 32), dyadic.sum(axis=0)),
        "model: pieces of exact values differ from their exact sum",
    )
    grouped = summed_gradient(rows, "float16", 8)
    pieces = [summed_gradient(rows[k : k + 8], "float16", None) for k in range(0, 77, 8)]
    failures.check(
        bits_equal(grouped, summed_gradient(np.stack(pieces), "float16", None)),
        "model: float16 pieces are not summed piece by piece",
    )


# --- the problem ----------------------------------------------------------------------


def _slot_values(rng, name: str, shape, average=None) -> np.ndarray:
    """A slot's state: positive where the rule takes its square root (and, for
    centered RMSprop, the velocity above the average gradient's square)."""
    if name in ("momentum", "average_gradient", "linear"):
        return rng.standard_normal(shape) * (0.01 if name == "average_gradient" else 0.1)
    positive = 0.01 + 0.01 * np.abs(rng.standard_normal(shape))
    return positive if average is None else positive + average**2


class RuleProblem:
    """Host arrays of one step of ``rule``: duplicates, frozen rows, and
    (``hot``) one permitted row occurring more often than a GPU piece holds.

    ``tables``: var, then the rule's slots by name, in its order.
    """

    def __init__(
        self,
        rng,
        rules,
        rule,
        value_dtype,
        index_dtype,
        compact,
        weight_decay,
        row_shape=(2, 9),
        hot=0,
        rows=60,
        indices=None,
        row_mask=None,
    ):
        info = rules[rule]
        self.rule, self.value_dtype = rule, value_dtype
        self.slot_names, self.per_row = list(info["slots"]), list(info["per_row"])
        self.hyper_names = list(info["hyperparameters"])
        self.rowwise = any(self.per_row)
        if indices is None:
            indices = rng.integers(0, 25, size=150)  # Duplicates.
            row_mask = rng.random(rows) < 0.6
            if hot:
                hot_row = int(rng.integers(25, rows))
                row_mask[hot_row] = True
                indices = np.concatenate([indices, np.full(hot, hot_row)])
                rng.shuffle(indices)
        rows = len(row_mask)
        self.indices, self.row_mask = indices.astype(index_dtype), row_mask
        num_slot_rows = rows
        self.slot_indices = None
        self.slot_of_row = None
        if compact:
            permitted = np.unique(self.indices[row_mask[self.indices]])
            num_slot_rows = len(permitted) + 3
            self.slot_of_row = np.full(rows, -1, np.int64)
            self.slot_of_row[permitted] = rng.permutation(num_slot_rows)[: len(permitted)]
            scratch = rng.integers(num_slot_rows, size=len(self.indices))
            mapped = self.slot_of_row[self.indices]
            self.slot_indices = np.where(mapped >= 0, mapped, scratch).astype(index_dtype)

        def table(values):
            return from_float(values, value_dtype)

        self.tables = {"var": table(rng.standard_normal((rows, *row_shape)))}
        average = None
        if "average_gradient" in self.slot_names:
            average = _slot_values(rng, "average_gradient", (num_slot_rows, *row_shape))
        for name, per_row in zip(self.slot_names, self.per_row):
            shape = (num_slot_rows,) if per_row else (num_slot_rows, *row_shape)
            values = average if name == "average_gradient" else None
            if values is None:
                values = _slot_values(rng, name, shape, None if per_row else average)
            self.tables[name] = table(values)
        self.gradient = table(rng.standard_normal((len(self.indices), *row_shape)))
        self.hyper = rule_hyperparameters(self.hyper_names, value_dtype, weight_decay)

    @property
    def row_size(self) -> int:
        return int(np.prod(self.tables["var"].shape[1:], dtype=np.int64))

    def copy_tables(self) -> dict:
        return {k: a.copy() for k, a in self.tables.items()}

    def regrouped(self, piece_size: int | None):
        """(indices, slot_indices, gradient) on which the CPU kernel sums each
        row as the GPU does: a permitted row with more than ``piece_size``
        occurrences keeps one occurrence per piece, at its first positions,
        holding the piece's sum (summed as the kernel rounds); the others are
        dropped. Other rows are left as they are."""
        if piece_size is None:
            return self.indices, self.slot_indices, self.gradient
        flat = self.indices.reshape(-1)
        counts = np.bincount(flat, minlength=len(self.row_mask))
        hot_rows = np.flatnonzero(self.row_mask & (counts > piece_size))
        if len(hot_rows) == 0:
            return self.indices, self.slot_indices, self.gradient
        keep = np.ones(len(flat), bool)
        gradient = self.gradient.copy()
        rows64 = to_float64(self.gradient, self.value_dtype)
        for row in hot_rows:
            positions = np.flatnonzero(flat == row)  # Increasing.
            starts = range(0, len(positions), piece_size)
            for piece, start in enumerate(starts):
                piece_rows = rows64[positions[start : start + piece_size]]
                total = summed_gradient(piece_rows, self.value_dtype, None)
                gradient[positions[piece]] = from_float(total, self.value_dtype)
            keep[positions[len(starts) :]] = False
        slot_indices = None if self.slot_indices is None else self.slot_indices[keep]
        return flat[keep], slot_indices, gradient[keep]


# --- running the kernels -----------------------------------------------------------


class RuleRunner:
    """Runs the fused step of one back end on host arrays (in place).

    ``piece_size``: how the back end sums a row's occurrences (None: in
    position order, as the CPU kernel does).
    """

    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name
        self.on_gpu = backend.on_gpu
        self.piece_size = backend.rule_piece_size

    def cpu(self, problem, tables, indices=None, slot_indices=SAME, gradient=None) -> None:
        """The back end's CPU kernel on host ``tables``, in place."""
        self.run(problem, tables, indices, slot_indices, gradient, reference=True)

    def run(
        self, problem, tables, indices=None, slot_indices=SAME, gradient=None, reference=False
    ) -> None:
        """The back end's kernel on host ``tables``, in place (also when the
        step is refused)."""
        indices = problem.indices if indices is None else indices
        slot_indices = problem.slot_indices if slot_indices is SAME else slot_indices
        gradient = problem.gradient if gradient is None else gradient
        self.backend.rule_step(problem, tables, indices, slot_indices, gradient, reference)

    def expected(self, problem) -> dict:
        """The CPU kernel's tables for this back end's grouping of the sums."""
        indices, slot_indices, gradient = problem.regrouped(self.piece_size)
        want = problem.copy_tables()
        self.cpu(problem, want, indices, slot_indices, gradient)
        return want


def rowwise_bound(problem, key, want, before) -> np.ndarray:
    """How far a row-wise rule's var or per-row slot may be from the CPU's.

    The row's sum of g * g differs by at most 2 (n - 1) u_C relative (its
    order; n the row size, u_C the compute type's unit roundoff), its mean
    rounded to T by that and one unit in the last place; a few more roundings
    to T may then flip on the way to the result. So: that relative error of
    what the step moved (and, where weight decay or an old velocity enters,
    of those), plus one unit in the last place of the result.
    """
    u_value = UNIT_ROUNDOFF[problem.value_dtype]
    u_compute = UNIT_ROUNDOFF["float64" if problem.value_dtype == "float64" else "float32"]
    relative = 2 * (problem.row_size + 5) * u_compute + 16 * u_value
    want64 = to_float64(want, problem.value_dtype)
    before64 = to_float64(before, problem.value_dtype)
    moved = np.abs(want64 - before64)
    if key == "var":
        hyper = dict(zip(problem.hyper_names, problem.hyper))
        moved = moved + 2 * np.abs(before64) * hyper["weight_decay"] * hyper["learning_rate"]
    else:
        moved = moved + np.abs(before64)
    tiny = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149}
    return relative * moved + 2 * u_value * np.abs(want64) + tiny.get(problem.value_dtype, 0.0)


def ftrl_bound(problem, key, want: dict, before: dict) -> np.ndarray:
    """How far FTRL's var or linear (``key``) may be from the CPU's, per
    element of that table (full-size or compact slots).

    The accumulator takes no pow and is compared bit for bit. Each of the two
    powers p(n) and p(a) (n the new accumulator, a the old) is the math
    library's pow, rounded to T: the GPU's and the CPU's differ by at most
    (GPU_POW_ULPS + CPU_POW_ULPS) ulps of the compute type, and one ulp of T
    after rounding. That difference is carried through the rule's arithmetic
    (cc/core/row_rules.h), each later operation rounding once more (one ulp of
    its result, where its inputs differ), (1 + 16u) a line for the products
    of small terms:
      sigma = (p(n) - p(a)) / lr;  linear += g + s * x - sigma * x;
      var = (clip(linear, l1) - linear) / (p(n) / lr + two_l2).
    Every magnitude is read from the tables before and after the CPU's step
    (x the old var, moved by weight decay at most lr * weight_decay).
    """
    dtype = problem.value_dtype
    u = UNIT_ROUNDOFF[dtype]
    u_compute = UNIT_ROUNDOFF["float64" if dtype == "float64" else "float32"]
    pow_relative = 2 * (GPU_POW_ULPS + CPU_POW_ULPS) * u_compute + 2 * u
    hyper = dict(zip(problem.hyper_names, problem.hyper))
    lr, two_l2, power = hyper["learning_rate"], hyper["two_l2"], hyper["power"]
    rows = problem.tables["var"].shape[0]
    # Each var row's slot row (-1: none, nothing written).
    slot_row = np.arange(rows) if problem.slot_of_row is None else problem.slot_of_row
    has_slot = slot_row >= 0
    x = np.abs(to_float64(before["var"], dtype))
    x_new = np.abs(to_float64(want["var"], dtype))

    def per_var_row(table_key, tables):
        values = to_float64(tables[table_key], dtype)
        out = np.zeros_like(x)
        out[has_slot] = values[slot_row[has_slot]]
        return out

    accumulator = np.maximum(per_var_row("accumulator", before), 0.0)
    updated = np.maximum(per_var_row("accumulator", want), 0.0)
    linear_old = per_var_row("linear", before)
    linear_new = per_var_row("linear", want)
    # |x| once weight decay has moved it (x - x * wd * lr, rounded twice).
    x = x * (1 + hyper["weight_decay"] * lr + 6 * u)
    # Each line: the difference its inputs carry, plus one ulp (2u relative)
    # of each rounding after them; (1 + 16u) for the products of small terms
    # and for the magnitudes being the CPU's rounded ones.
    grow = 1 + 16 * u
    p_new, p_old = updated**power, accumulator**power
    d_new, d_old = pow_relative * p_new, pow_relative * p_old
    sigma = np.abs(p_new - p_old) / lr
    d_sigma = ((d_new + d_old) / lr + 4 * u * sigma) * grow  # sub, div
    d_linear = (  # mul, sub, add
        x * d_sigma + 2 * u * (sigma * x + np.abs(linear_new - linear_old) + np.abs(linear_new))
    ) * grow
    quadratic = p_new / lr + two_l2
    d_quadratic = (d_new / lr + 2 * u * (p_new / lr + quadratic)) * grow  # div, add
    numerator = x_new * quadratic
    d_numerator = (2 * d_linear + 2 * u * numerator) * grow  # clip and linear, sub
    with np.errstate(divide="ignore", invalid="ignore"):
        below = np.maximum(quadratic - d_quadratic, 0.0)
        d_var = ((d_numerator + x_new * d_quadratic) / below + 2 * u * x_new) * grow  # div
    tiny = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149}
    bound = (d_linear if key == "linear" else d_var) + tiny.get(dtype, 0.0)
    if key == "var":
        return bound
    slot_bound = np.zeros(want["linear"].shape, np.float64)
    slot_bound[slot_row[has_slot]] = bound[has_slot]
    return slot_bound


def ftrl_takes_pow(problem) -> bool:
    """Whether an FTRL problem's exponent is computed by pow (FtrlPower)."""
    return dict(zip(problem.hyper_names, problem.hyper))["power"] not in EXACT_FTRL_POWERS


def compare_tables(failures, name, problem, got, want, before=None) -> None:
    """Bit for bit, except where ``before`` is given (the GPU against the
    CPU), on the elements written: a row-wise rule's var and per-row slot
    within rowwise_bound, FTRL's var and linear within ftrl_bound where its
    exponent takes pow; bit for bit elsewhere."""
    per_row = dict(zip(problem.slot_names, problem.per_row))
    for key in want:
        rowwise = problem.rowwise and (key == "var" or per_row[key])
        ftrl = problem.rule == "ftrl" and key in ("var", "linear") and ftrl_takes_pow(problem)
        if before is None or not (rowwise or ftrl):
            failures.check(bits_equal(got[key], want[key]), f"{name}: {key} differs bit for bit")
            continue
        written = ~bits_equal_elements(want[key], before[key])
        same = bits_equal(got[key][~written], want[key][~written])
        error = np.abs(
            to_float64(got[key], problem.value_dtype) - to_float64(want[key], problem.value_dtype)
        )
        if rowwise:
            bound = rowwise_bound(problem, key, want[key], before[key])
        else:
            bound = ftrl_bound(problem, key, want, before)
        bad = ~(error <= bound) & written  # A NaN counts as wrong.
        message = f"{name}: {key} differs outside the rows written"
        if bad.any():
            where = tuple(np.argwhere(bad)[0])
            message = (
                f"{name}: {key}{list(where)} off by {error[where]:.3g} (bound {bound[where]:.3g})"
            )
        failures.check(same and not bad.any(), message)


def bits_equal_elements(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element: whether a and b hold the same bits."""
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.ascontiguousarray(a).view(unsigned) == np.ascontiguousarray(b).view(unsigned)


# --- correctness ---------------------------------------------------------------------


def rule_checks(backend, rng, failures: Failures, quick: bool) -> None:
    """Every rule, dtype, index type and layout against the CPU kernel;
    refusals; a Zipf batch."""
    missing = backend.lacks("masked_sparse_apply_rule")
    if missing:
        failures.check(False, missing)
        return
    runner = RuleRunner(backend)
    rules = backend.rules
    failures.check(bool(rules), f"{runner.name}: no rule table (the kernel module's RULES)")
    check_model(rng, failures)
    hot = 3 * 32 + 5  # Four pieces on the GPU, the last one short.
    repeated = set()
    for rule, value_dtype, index_dtype, compact, decay, shape in rule_cases(rules):
        problem = RuleProblem(
            rng, rules, rule, value_dtype, index_dtype, compact, decay, shape, hot=hot
        )
        name = (
            f"{runner.name} {rule} {value_dtype} {np.dtype(index_dtype).name} "
            f"{'compact' if compact else 'full-size'} slots {shape}"
            f"{' weight decay' if decay else ''}"
        )
        first = problem.copy_tables()
        runner.run(problem, first)
        compare_tables(
            failures,
            name,
            problem,
            first,
            runner.expected(problem),
            problem.tables if runner.on_gpu else None,
        )
        untouched_checks(failures, name, problem, first)
        if rule not in repeated:  # Once a rule: the same inputs, the same bits.
            repeated.add(rule)
            second = problem.copy_tables()
            runner.run(problem, second)
            compare_tables(failures, f"{name} (run again)", problem, second, first)
    for r, rule in enumerate(rules):
        value_dtype = VALUE_DTYPES[r % len(VALUE_DTYPES)]
        refusal_checks(runner, rng, failures, rules, rule, value_dtype, INDEX_DTYPES[r % 2])
    large_checks(runner, rng, failures, quick)


def untouched_checks(failures, name, problem, got) -> None:
    """Frozen and unindexed rows, and the slot rows no permitted row names,
    keep their bits."""
    permitted = np.zeros(len(problem.row_mask), bool)
    permitted[problem.indices[problem.row_mask[problem.indices]]] = True
    slot_rows = permitted
    if problem.slot_of_row is not None:
        slot_rows = np.zeros(problem.tables[problem.slot_names[0]].shape[0], bool)
        slot_rows[problem.slot_of_row[permitted]] = True
    for key, before in problem.tables.items():
        rows = permitted if key == "var" else slot_rows
        failures.check(
            bits_equal(got[key][~rows], before[~rows]),
            f"{name}: {key} changed on a frozen, unindexed or unmapped row",
        )


def refusal_checks(runner, rng, failures, rules, rule, value_dtype, index_dtype) -> None:
    """Each way to refuse a step: the error the CPU kernel raises, with its
    message, and no table written (full-size slots for a rule without any)."""
    compact = len(rules[rule]["slots"]) > 0
    problem = RuleProblem(rng, rules, rule, value_dtype, index_dtype, compact, True)
    permitted = np.flatnonzero(problem.row_mask[problem.indices])
    cases = []
    bad = problem.indices.copy()
    bad[permitted[-1]] = problem.tables["var"].shape[0]
    bad[-1] = -1
    cases.append(("index out of range", bad, problem.slot_indices, IndexError, "is not in [0, "))
    if compact:
        num_slot_rows = problem.tables[problem.slot_names[0]].shape[0]
        bad_slots = problem.slot_indices.copy()
        bad_slots[permitted[-1]] = num_slot_rows
        cases.append(("slot index out of range", None, bad_slots, IndexError, "is not in [0, "))
        row = problem.indices[permitted[0]]
        repeats = np.flatnonzero(problem.indices == row)
        if len(repeats) >= 2:
            bad_slots = problem.slot_indices.copy()
            bad_slots[repeats[-1]] = (bad_slots[repeats[0]] + 1) % num_slot_rows
            text = {"module": "different slot rows", "tensorflow": "must name the same slot row"}
            cases.append(("two slot rows", None, bad_slots, ValueError, text))
        rows = np.unique(problem.indices[permitted])
        if len(rows) >= 2:
            bad_slots = problem.slot_indices.copy()
            bad_slots[problem.indices == rows[1]] = bad_slots[problem.indices == rows[0]][0]
            text = {"module": "the same slot row", "tensorflow": "cannot share a slot row"}
            cases.append(("shared slot row", None, bad_slots, ValueError, text))
    for broken, indices, slot_indices, error_type, text in cases:
        name = f"{runner.name} {rule} {value_dtype} {np.dtype(index_dtype).name} refused: {broken}"
        if isinstance(text, dict):  # The module's and the op's own words.
            text = text[runner.backend.front_end]
        refused = runner.backend.refusal(error_type)
        expected_message = None
        if runner.on_gpu:
            try:
                runner.cpu(problem, problem.copy_tables(), indices, slot_indices)
            except refused as error:
                expected_message = runner.backend.message(error)
        tables = problem.copy_tables()
        try:
            runner.run(problem, tables, indices, slot_indices)
            failures.check(False, f"{name}: no {refused.__name__}")
        except refused as error:
            message = runner.backend.message(error)
            failures.check(text in message, f"{name}: wrong message {message}")
            if expected_message is not None:
                failures.check(
                    message == expected_message,
                    f"{name}: {message} is not the CPU kernel's {expected_message}",
                )
        compare_tables(failures, f"{name}: written", problem, tables, problem.tables)


def zipf_rows(rng, num_ids: int, num_rows: int, exponent: float = 1.2) -> np.ndarray:
    """Zipf-distributed ids over ``num_rows`` rows, the hottest scattered."""
    ranks = rng.zipf(exponent, size=num_ids) - 1
    ranks = ranks[ranks < num_rows]
    while len(ranks) < num_ids:
        more = rng.zipf(exponent, size=num_ids) - 1
        ranks = np.concatenate([ranks, more[more < num_rows]])
    # An odd multiplier permutes [0, 2**k); take ranks modulo num_rows after.
    return ((ranks[:num_ids].astype(np.int64) * 0x9E3779B1) % num_rows).astype(np.int64)


# (rule, value dtype, index dtype, row size, compact): the first two in --quick.
LARGE_CASES = (
    ("adam", "float32", np.int64, 128, False),
    ("rowwise_adam", "bfloat16", np.int32, 9, True),
    ("amsgrad", "float64", np.int32, 36, False),
    ("rowwise_adagrad", "float16", np.int64, 64, True),
    ("ftrl", "float32", np.int64, 64, True),
)


def large_checks(runner, rng, failures, quick: bool) -> None:
    """A Zipf batch with rows thousands of times hot, wide and narrow rows:
    the GPU result equals the CPU kernel's on the regrouped sums (within
    rowwise_bound for a row-wise rule's var and per-row slot)."""
    rules = runner.backend.rules
    for rule, value_dtype, index_dtype, width, compact in LARGE_CASES[: 2 if quick else None]:
        num_rows, num_ids = 20000, 20000 if quick else 100000
        indices = zipf_rows(rng, num_ids, num_rows)
        row_mask = rng.random(num_rows) < 0.7
        problem = RuleProblem(
            rng, rules, rule, value_dtype, index_dtype, compact, False, (width,),
            indices=indices, row_mask=row_mask,
        )  # fmt: skip
        counts = np.bincount(indices, minlength=num_rows)
        permitted = np.count_nonzero(row_mask & (counts > 0))
        name = (
            f"{runner.name} {rule} {value_dtype} {np.dtype(index_dtype).name} D={width} "
            f"{num_ids} Zipf ids, {permitted} permitted rows, hottest {counts.max()}"
        )
        started = time.perf_counter()
        got = problem.copy_tables()
        runner.run(problem, got)
        want = runner.expected(problem)
        compare_tables(failures, name, problem, got, want, problem.tables)
        hot_rows = 0
        if runner.piece_size is not None:
            hot_rows = np.count_nonzero(row_mask & (counts > runner.piece_size))
        print(
            f"  {name}: {hot_rows} rows hotter than a piece, {time.perf_counter() - started:.1f} s",
            flush=True,
        )


# --- timing ----------------------------------------------------------------------------

# (label, rows V, distinct rows k or None for a Zipf batch, ids)
TIMING_CASES = (
    ("k=65,536 unique (V=1M)", 1 << 20, 1 << 16, 1 << 16),
    ("k=524,288 unique (V=4M)", 1 << 22, 1 << 19, 1 << 19),
    ("Zipf 524,288 ids (V=16M)", 1 << 24, None, 1 << 19),
)
TARGETS = {0: 2.0, 1: 1.5, 2: 3.0}  # Ratio to the floor the issue asks for.


def cuda_milliseconds(torch, run: Callable[[], None], warmup: int = 2, repeats: int = 10) -> float:
    for _ in range(warmup):
        run()
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / repeats


def import_torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def time_rule(backend, rule, host_ids, num_rows, width, hyperparameters) -> float:
    """Mean milliseconds of one float32 step of ``rule`` on fresh tables."""
    info = backend.rules[rule]
    var = backend.empty((num_rows, width), np.float32)
    fill_float(backend, var, 0.5)
    slots = []
    for per_row in info["per_row"]:
        slot = backend.empty((num_rows,) if per_row else (num_rows, width), np.float32)
        fill_float(backend, slot, 0.01)
        slots.append(slot)
    gradient = backend.empty((len(host_ids), width), np.float32)
    fill_float(backend, gradient, 1e-3)
    ids = backend.to_device(host_ids)
    row_mask = backend.to_device(np.ones(num_rows, dtype=bool))
    milliseconds = backend.kernels.time_masked_sparse_apply_rule_gpu(
        rule, var, slots, ids, None, gradient, row_mask, hyperparameters, warmup=2, repeats=10
    )
    del var, slots, gradient, ids, row_mask
    if backend.cupy is not None:  # Give the tables back for the next case.
        backend.cupy.get_default_memory_pool().free_all_blocks()
    return milliseconds


def rule_timing(backend, rng, copy_gbps: float, quick: bool, max_gb: float):
    """The Adam rule against the floor, SparseAdam and stock ops, then every
    rule at the first size; returns the printed table and Adam's summary for
    the JSON."""
    torch = import_torch()
    width, itemsize = 128, 4
    adam_hyper = [HYPERPARAMETERS[n] for n in backend.rules["adam"]["hyperparameters"]]
    adam_hyper[1] = 0.0  # No weight decay.
    header = (
        f"{'adam float32 D=128':26} {'k':>8} {'floor ms':>8} {'ours ms':>8} {'x floor':>7} "
        f"{'target':>6} {'SparseAdam':>10} {'x':>6} {'stock ops':>10} {'x':>6}"
    )
    lines = [header]
    print(header, flush=True)
    summary = []
    cases = TIMING_CASES[:1] if quick else TIMING_CASES
    for number, (label, num_rows, distinct, num_ids) in enumerate(cases):
        table_gb = 3 * num_rows * width * itemsize / 1e9
        if table_gb > max_gb:
            print(f"{label}: skipped ({table_gb:.1f} GB of tables > --max-adam-gb {max_gb})")
            continue
        if distinct is None:
            host_ids = zipf_rows(rng, num_ids, num_rows)
        else:
            host_ids = rng.choice(num_rows, size=distinct, replace=False).astype(np.int64)
        unique = len(np.unique(host_ids))
        moved = unique * width * itemsize * 6 + num_ids * width * itemsize
        floor_ms = moved / copy_gbps / 1e6
        ours = time_rule(backend, "adam", host_ids, num_rows, width, adam_hyper)
        sparse_adam = stock = None
        if torch is not None:
            sparse_adam, stock = torch_adam_times(torch, host_ids, num_rows, width)
        entry = {
            "case": label,
            "rows": num_rows,
            "ids": num_ids,
            "unique": unique,
            "floor_ms": floor_ms,
            "ours_ms": ours,
            "ours_x_floor": ours / floor_ms,
            "target_x_floor": TARGETS[number],
            "sparse_adam_ms": sparse_adam,
            "stock_ops_ms": stock,
        }
        summary.append(entry)

        def ratio(ms, floor_ms=floor_ms):
            return f"{'-':>10} {'-':>6}" if ms is None else f"{ms:10.3f} {ms / floor_ms:5.1f}x"

        line = (
            f"{label:26} {unique:8d} {floor_ms:8.3f} {ours:8.3f} {ours / floor_ms:6.2f}x "
            f"{TARGETS[number]:5.1f}x {ratio(sparse_adam)} {ratio(stock)}"
        )
        lines.append(line)
        print(line, flush=True)
    lines += every_rule_timing(backend, rng, copy_gbps)
    return lines, summary


def every_rule_timing(backend, rng, copy_gbps: float) -> list[str]:
    """Each rule, float32 D=128, k = 65,536 distinct rows of V = 1M, against
    its own floor (var and the per-element slots' rows read and written, the
    per-row slots' values, the gradient read)."""
    label, num_rows, distinct, _ = TIMING_CASES[0]
    width, itemsize = 128, 4
    host_ids = rng.choice(num_rows, size=distinct, replace=False).astype(np.int64)
    lines = [f"{'every rule, float32 D=128, ' + label:52} {'floor ms':>8} {'ours ms':>8} {'x':>6}"]
    print(lines[0], flush=True)
    for rule, info in backend.rules.items():
        hyper = [HYPERPARAMETERS[n] for n in info["hyperparameters"]]
        hyper[1] = 0.0  # No weight decay.
        element_tables = 1 + sum(not per_row for per_row in info["per_row"])
        moved = (
            distinct * itemsize * (2 * width * element_tables + 2 * sum(info["per_row"]) + width)
        )
        floor_ms = moved / copy_gbps / 1e6
        ours = time_rule(backend, rule, host_ids, num_rows, width, hyper)
        lines.append(f"{rule:52} {floor_ms:8.3f} {ours:8.3f} {ours / floor_ms:5.1f}x")
        print(lines[-1], flush=True)
    return lines


def fill_float(backend, array, value: float) -> None:
    if backend.cupy is not None:
        array.fill(value)
    else:
        array.fill_(value)


def torch_adam_times(torch, host_ids: np.ndarray, num_rows: int, width: int):
    """PyTorch's SparseAdam step and the same lazy step in stock ops (ms)."""
    ids = torch.from_numpy(host_ids).cuda()
    values = torch.full((len(host_ids), width), 1e-3, device="cuda")
    sparse_adam = sparse_adam_milliseconds(torch, ids, values, num_rows, width)
    torch.cuda.empty_cache()
    stock = stock_adam_milliseconds(torch, ids, values, num_rows, width)
    torch.cuda.empty_cache()
    return sparse_adam, stock


def sparse_adam_milliseconds(torch, ids, values, num_rows: int, width: int) -> float:
    weight = torch.nn.Parameter(torch.full((num_rows, width), 0.5, device="cuda"))
    optimizer = torch.optim.SparseAdam([weight], lr=0.001)
    gradient = torch.sparse_coo_tensor(ids[None], values, (num_rows, width))

    def step():
        weight.grad = gradient
        optimizer.step()

    return cuda_milliseconds(torch, step)


def stock_adam_milliseconds(torch, ids, values, num_rows: int, width: int) -> float:
    """Lazy Adam in stock ops: the distinct rows, a segment sum with
    index_add_, three gathers, the rule, three scatters."""
    var = torch.full((num_rows, width), 0.5, device="cuda")
    m = torch.zeros((num_rows, width), device="cuda")
    v = torch.zeros((num_rows, width), device="cuda")

    def step():
        rows, inverse = torch.unique(ids, return_inverse=True)
        g = torch.zeros((len(rows), width), device="cuda").index_add_(0, inverse, values)
        m_rows, v_rows, x = m[rows], v[rows], var[rows]
        m_new = m_rows + (g - m_rows) * 0.1
        v_new = v_rows + (g * g - v_rows) * 0.001
        m[rows], v[rows] = m_new, v_new
        var[rows] = x - m_new * 0.001 / (torch.sqrt(v_new) + 1e-7)

    return cuda_milliseconds(torch, step)
