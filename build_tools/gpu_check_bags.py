"""gpu_check.py's checks of the bag gradient (MaskedEmbeddingBagGrad's core).

Through any back end of gpu_check.py: the bag gradient (rows ascending on a
GPU, in order of first occurrence on the CPU) against a float64 NumPy
reference on fresh random bags (every value dtype and index type, pruned and
frozen ids, duplicates within and across bags, a hot row whose run spans many
positions), twice bit-identical, an id out of range refused with its bag and
position, zero sizes; where the back end runs CPU kernels, the forward pass
too (it has no GPU kernel). On a GPU through the module, then a timing table.

Then the fused bag backward + rule step (MaskedEmbeddingBagApplyRule and its
slot-map twin), through the kernel module's entry points or, with
--tensorflow-ops, the ops on variables (their CPU kernels, and their GPU
kernels on a GPU): every rule of the
table once (value dtype and index type rotating), Adam on every value dtype
and index type. The CPU kernel is checked bit for bit against the unfused
pair it replaces (the bag gradient, then the rule step on its rows) and, for
SGD and Adam, against a float64 NumPy step; the GPU core against the CPU
kernel: every table bit for bit for an element-wise rule, and for a row-wise
rule its element-wise slots bit for bit and var and the per-row slot within
gpu_check_rules.rowwise_bound (cc/core/embedding_bag_apply_gpu.h); frozen and
absent rows keep their bits, a second run gives the same bits, and an id out
of range or a bag out of range is refused with its message and nothing
written. With compact slots (four rules): the CPU kernel against the unfused
pair at the slot rows it gave, the GPU's map, count and tables against the
CPU's (new slot rows in order of first occurrence), three map refusals with
nothing written, and through the ops a step that grows full slots.
"""

from __future__ import annotations

import numpy as np

import gpu_check_common as common
from gpu_check_rules import compare_tables, rule_hyperparameters


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
    bag_rule_checks(backend, rng, failures, quick)


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


# --- the fused bag backward + rule step ----------------------------------------------


class BagRuleProblem(BagProblem):
    """A bag gradient and the tables of one step of ``rule``: what
    compare_tables and rowwise_bound read of a rule problem. With ``compact``,
    the slots are compact behind a slot map (``slot_of_row``, float32 [V],
    -1 for none; ``rows_used`` slot rows taken, a permutation of them held by
    a third of the rows), with room for every row the step can add."""

    def __init__(
        self,
        rng,
        rules,
        rule,
        value_dtype,
        index_dtype,
        row_size,
        decay,
        compact=False,
        spare_slot_rows=None,
    ):
        super().__init__(rng, value_dtype, index_dtype, 40, row_size, 12, 3, 0.15)
        info = rules[rule]
        self.slot_of_row, self.rows_used = None, 0
        num_slot_rows = self.num_rows
        if compact:
            mapped = rng.permutation(self.num_rows)[: self.num_rows // 3]
            self.rows_used = len(mapped)
            self.slot_of_row = np.full(self.num_rows, -1.0, np.float32)
            self.slot_of_row[mapped] = rng.permutation(self.rows_used)
            num_slot_rows = self.num_rows + 2
            if spare_slot_rows is not None:  # Fewer: a step must grow them.
                num_slot_rows = self.rows_used + spare_slot_rows
        self.rule = rule
        self.slot_names, self.per_row = list(info["slots"]), list(info["per_row"])
        self.rowwise = any(self.per_row)
        self.hyper_names = list(info["hyperparameters"])
        self.hyper = rule_hyperparameters(self.hyper_names, value_dtype, decay)
        self.tables = {"var": self._table(rng.standard_normal((self.num_rows, row_size)))}
        for name, per_row in zip(self.slot_names, self.per_row):
            shape = (num_slot_rows,) if per_row else (num_slot_rows, row_size)
            if name in ("momentum", "average_gradient"):
                values = 0.1 * rng.standard_normal(shape)
            else:  # Positive where the rule takes a square root.
                values = 0.01 + 0.01 * np.abs(rng.standard_normal(shape))
            self.tables[name] = self._table(values)
        if "average_gradient" in self.tables:  # Centered: velocity above its square.
            velocity = common.to_float64(self.tables["velocity"], value_dtype)
            average = common.to_float64(self.tables["average_gradient"], value_dtype)
            self.tables["velocity"] = self._table(velocity + average**2)

    def _table(self, values):
        return common.from_float(values, self.value_dtype)

    @property
    def row_size(self) -> int:
        return int(self.grad.shape[1])

    def copy_tables(self) -> dict:
        """The tables, and with compact slots the map too, to be written."""
        tables = {k: a.copy() for k, a in self.tables.items()}
        if self.slot_of_row is not None:
            tables["slot_of_row"] = self.slot_of_row.copy()
        return tables

    def permitted_rows(self) -> np.ndarray:
        """Whether each row is stepped: permitted and named by an unpruned id."""
        stepped = np.zeros(self.num_rows, bool)
        kept = self.ids >= 0
        ids = self.ids[kept].astype(np.int64)
        stepped[ids[self.row_mask[ids]]] = True
        return stepped


def _bag_rule_cases(rules: dict) -> list[tuple]:
    """(rule, value dtype, index dtype, row size, weight decay): every rule
    once, the dtypes rotating; then Adam on every value dtype and index type.
    Row sizes: one element a lane, 16-byte rows in every dtype, two passes of
    a warp."""
    sizes = (5, 24, 37, 80)
    cases = []
    for r, rule in enumerate(rules):
        value_dtype = common.VALUE_DTYPES[r % len(common.VALUE_DTYPES)]
        index_dtype = common.INDEX_DTYPES[(r // len(common.VALUE_DTYPES)) % 2]
        cases.append((rule, value_dtype, index_dtype, sizes[r % len(sizes)], r % 2 == 0))
    for d, value_dtype in enumerate(common.VALUE_DTYPES):
        for i, index_dtype in enumerate(common.INDEX_DTYPES):
            if "adam" in rules:
                cases.append(
                    ("adam", value_dtype, index_dtype, sizes[(d + i) % len(sizes)], i == 1)
                )
    return cases


def _slot_indices(problem, slot_of_row, rows):
    """The unfused rule step's slot indices: with compact slots (and a rule
    with slots), ``rows``' slot rows in ``slot_of_row``; else None."""
    if slot_of_row is None or not problem.slot_names:
        return None
    return slot_of_row[rows].astype(rows.dtype)


class _ModuleBagRule:
    """The fused step through the kernel module: its CPU kernel on host
    arrays, its GPU core on device copies (tables are host arrays, written in
    place, also when the step is refused)."""

    def __init__(self, backend):
        self.backend, self.kernels = backend, backend.kernels

    def refusal(self, error_type):
        return error_type

    @staticmethod
    def message(error) -> str:
        return str(error)

    def cpu(self, problem, tables, ids=None, bags=None, rows_used=None):
        """The step; the slot rows in use after it (compact slots)."""
        return self.kernels.masked_embedding_bag_apply_rule_cpu(
            problem.rule,
            tables["var"],
            [tables[name] for name in problem.slot_names],
            problem.grad,
            problem.ids if ids is None else ids,
            problem.bags if bags is None else bags,
            problem.factors,
            problem.row_mask,
            problem.hyper,
            slot_of_row=tables.get("slot_of_row"),
            rows_used=problem.rows_used if rows_used is None else rows_used,
            dtype=common.dtype_argument(problem.value_dtype),
        )

    def unfused_cpu(self, problem, tables, slot_of_row=None):
        """The pair the fused step replaces: the bag gradient, then the rule
        step on its rows (with compact slots, at their rows in
        ``slot_of_row``, the map after the fused step)."""
        rows, values = self.backend.bag_gradient_cpu(problem)
        slot_indices = _slot_indices(problem, slot_of_row, rows)
        self.backend.rule_cpu(problem, tables, rows, slot_indices, values)

    def gpu(self, problem, tables, ids=None, bags=None, rows_used=None):
        backend = self.backend
        device = {k: backend.to_device(a) for k, a in tables.items()}
        try:
            return self.kernels.masked_embedding_bag_apply_rule_gpu(
                problem.rule,
                device["var"],
                [device[name] for name in problem.slot_names],
                backend.to_device(problem.grad),
                backend.to_device(problem.ids if ids is None else ids),
                backend.to_device(problem.bags if bags is None else bags),
                backend.to_device(problem.factors),
                backend.to_device(problem.row_mask),
                problem.hyper,
                slot_of_row=device.get("slot_of_row"),
                rows_used=problem.rows_used if rows_used is None else rows_used,
                dtype=common.dtype_argument(problem.value_dtype),
            )
        finally:
            for key, array in device.items():
                tables[key][...] = backend.to_host(array, tables[key])


class _TensorFlowBagRule:
    """The fused step through the ops (MaskedEmbeddingBagApplyRule) on
    variables: on the CPU (its CPU kernel), and on the back end's device (the
    GPU kernel there, whatever the Python opt-in says: the raw op is called)."""

    def __init__(self, backend):
        self.backend, self.tf, self.ops = backend, backend.tf, backend.ops

    def refusal(self, error_type):
        return self.backend.refusal(error_type)

    def message(self, error) -> str:
        return self.backend.message(error)

    def _step(self, device, problem, tables, ids, bags, rows_used):
        """The op on variables made from ``tables`` (replaced by their values
        after, also when refused: compact slots may have grown); with a slot
        map, the count after the step."""
        backend, tf = self.backend, self.tf
        variables = {k: backend._variable(a, device) for k, a in tables.items()}
        hyper = common.from_float(np.array(problem.hyper), problem.value_dtype)
        inputs = dict(
            var=variables["var"].handle,
            slots=[variables[name].handle for name in problem.slot_names],
            grad=backend._value(problem.grad),
            ids=problem.ids if ids is None else ids,
            bags=problem.bags if bags is None else bags,
            factors=problem.factors,
            row_mask=problem.row_mask,
            hyperparameters=backend._value(hyper),
            rule=problem.rule,
        )
        count = None
        try:
            with tf.device(device):
                if "slot_of_row" not in tables:
                    self.ops.partial_embedding_masked_embedding_bag_apply_rule(**inputs)
                else:
                    used = problem.rows_used if rows_used is None else rows_used
                    count = backend._variable(np.array(used, np.int64), device)
                    initial = np.zeros(len(problem.slot_names))
                    self.ops.partial_embedding_masked_embedding_bag_apply_rule_with_slot_map(
                        slot_of_row=variables["slot_of_row"].handle,
                        slot_rows_used=count.handle,
                        slot_initial_values=backend._value(
                            common.from_float(initial, problem.value_dtype)
                        ),
                        **inputs,
                    )
        finally:
            for key, variable in variables.items():
                tables[key] = backend._host(variable, tables[key])
        return None if count is None else int(count.numpy())

    def cpu(self, problem, tables, ids=None, bags=None, rows_used=None):
        return self._step("/CPU:0", problem, tables, ids, bags, rows_used)

    def unfused_cpu(self, problem, tables, slot_of_row=None):
        rows, values = self.backend.bag_gradient(problem, "/CPU:0")
        slot_indices = _slot_indices(problem, slot_of_row, rows)
        self.backend.rule_step(problem, tables, rows, slot_indices, values, True)

    def gpu(self, problem, tables, ids=None, bags=None, rows_used=None):
        return self._step(self.backend.device, problem, tables, ids, bags, rows_used)


def _reference_step(problem):
    """SGD or Adam in float64 on the stepped rows ({name: float64 table}),
    and each table's scale of what its rounding may move (per element)."""
    f64 = {k: common.to_float64(a, problem.value_dtype) for k, a in problem.tables.items()}
    _, g_rows, _ = problem.expected()
    stepped = np.flatnonzero(problem.permitted_rows())
    g = g_rows  # Rows ascending, as np.flatnonzero gives them.
    hyper = dict(zip(problem.hyper_names, problem.hyper))
    lr, decay = hyper["learning_rate"], hyper["weight_decay"]
    want = {k: a.copy() for k, a in f64.items()}
    scale = {k: np.zeros_like(a) for k, a in f64.items()}
    var = f64["var"][stepped]
    decayed = var - var * decay * lr
    if problem.rule == "sgd":
        want["var"][stepped] = decayed - g * lr
        scale["var"][stepped] = np.abs(var) + np.abs(g * lr)
        return want, scale
    m_old, v_old = f64["momentum"][stepped], f64["velocity"][stepped]
    m = m_old + (g - m_old) * hyper["one_minus_beta_1"]
    v = v_old + (g * g - v_old) * hyper["one_minus_beta_2"]
    denominator = np.sqrt(v) + hyper["epsilon"]
    want["momentum"][stepped], want["velocity"][stepped] = m, v
    want["var"][stepped] = decayed - m * hyper["alpha"] / denominator
    scale["momentum"][stepped] = np.abs(m_old) + np.abs(g)
    scale["velocity"][stepped] = np.abs(v_old) + g * g
    scale["var"][stepped] = np.abs(var) + (np.abs(m_old) + np.abs(g)) * hyper["alpha"] / (
        denominator - hyper["epsilon"] / 2
    )
    return want, scale


def _check_reference(failures, name, problem, got):
    """Every table within a few roundings of the float64 step (each operation
    rounds in the value dtype; the gradient's own bound is BagProblem's)."""
    want, scale = _reference_step(problem)
    u = common.UNIT_ROUNDOFF[problem.value_dtype]
    tiny = {"float16": 2.0**-24}.get(problem.value_dtype, 0.0)
    for key in want:
        error = np.abs(common.to_float64(got[key], problem.value_dtype) - want[key])
        bound = 24 * u * scale[key] + 2 * u * np.abs(want[key]) + 8 * tiny
        bad = ~(error <= bound)
        if bad.any():
            where = tuple(np.argwhere(bad)[0])
            failures.check(
                False,
                f"{name}: {key}{list(where)} off the float64 step by {error[where]:.3g} "
                f"(bound {bound[where]:.3g})",
            )
        else:
            failures.check(True, "")


def _check_untouched(failures, name, problem, got):
    stepped = problem.permitted_rows()
    for key, before in problem.tables.items():
        failures.check(
            common.bits_equal(got[key][~stepped], before[~stepped]),
            f"{name}: {key} changed on a frozen or absent row",
        )


def bag_rule_checks(backend, rng, failures, quick: bool) -> None:
    """The fused bag backward + rule step: the CPU kernel, and the GPU one on
    a GPU back end, through the kernel module or the ops; see the module
    docstring."""
    del quick  # Small problems either way: a few seconds on the emulator.
    if getattr(backend, "front_end", "module") == "tensorflow":
        runner = _TensorFlowBagRule(backend)
    else:
        missing = backend.lacks("masked_embedding_bag_apply_rule")
        if missing:
            failures.check(False, missing)
            return
        runner = _ModuleBagRule(backend)
    repeated = set()
    for rule, value_dtype, index_dtype, row_size, decay in _bag_rule_cases(backend.rules):
        problem = BagRuleProblem(
            rng, backend.rules, rule, value_dtype, index_dtype, row_size, decay
        )
        name = (
            f"{backend.name} bag {rule} {value_dtype} {np.dtype(index_dtype).name} "
            f"D={row_size} ids={problem.ids.size}{' weight decay' if decay else ''}"
        )
        cpu = problem.copy_tables()
        runner.cpu(problem, cpu)
        unfused = problem.copy_tables()
        runner.unfused_cpu(problem, unfused)
        for key in cpu:
            failures.check(
                common.bits_equal(cpu[key], unfused[key]),
                f"{name}: the CPU kernel's {key} differs from the unfused pair's",
            )
        _check_untouched(failures, f"{name} cpu", problem, cpu)
        if rule in ("sgd", "adam"):
            _check_reference(failures, f"{name} cpu", problem, cpu)
        if not backend.on_gpu:
            continue
        gpu = problem.copy_tables()
        runner.gpu(problem, gpu)
        compare_tables(failures, name, problem, gpu, cpu, problem.tables)
        _check_untouched(failures, name, problem, gpu)
        if rule in ("sgd", "adam"):
            _check_reference(failures, name, problem, gpu)
        if rule not in repeated:
            repeated.add(rule)
            again = problem.copy_tables()
            runner.gpu(problem, again)
            failures.check(
                all(common.bits_equal(again[k], gpu[k]) for k in gpu),
                f"{name}: two runs differ",
            )
    for d, value_dtype in enumerate(common.VALUE_DTYPES):
        index_dtype = common.INDEX_DTYPES[d % 2]
        _bag_rule_refusals(backend, runner, rng, failures, value_dtype, index_dtype)
    _compact_checks(backend, runner, rng, failures)


def _bag_rule_refusals(backend, runner, rng, failures, value_dtype, index_dtype):
    """An id out of range and a bag out of range, each after valid positions
    of permitted rows: refused with the CPU kernel's message, nothing
    written; then a batch with no permitted row: nothing written, no error."""
    rule = "adam" if "adam" in backend.rules else next(iter(backend.rules))
    problem = BagRuleProblem(rng, backend.rules, rule, value_dtype, index_dtype, 8, True)
    problem.row_mask[:] = True
    n = problem.ids.size
    bad_id = problem.ids.copy()
    bad_id[n // 2] = problem.num_rows
    bad_bag = problem.bags.copy()
    bad_bag[n // 2] = problem.grad.shape[0]
    place = int(np.sum(problem.bags[: n // 2] == problem.bags[n // 2]))
    cases = [
        (
            "id out of range",
            bad_id,
            problem.bags,
            IndexError,
            f"sp_ids: bag {problem.bags[n // 2]}, position {place} = {problem.num_rows} "
            f"is not in [0, {problem.num_rows})",
        ),
        (
            "bag out of range",
            problem.ids,
            bad_bag,
            ValueError,
            f"bags[{n // 2}] = {problem.grad.shape[0]} is not in [0, {problem.grad.shape[0]})",
        ),
    ]
    runs = [("cpu", runner.cpu)]
    if backend.on_gpu:
        runs.append((backend.name, runner.gpu))
    for where, run in runs:
        name = f"{where} bag {rule} {value_dtype} {np.dtype(index_dtype).name}"
        for what, ids, bags, error_type, text in cases:
            tables = problem.copy_tables()
            try:
                run(problem, tables, ids, bags)
                failures.check(False, f"{name} {what}: no {error_type.__name__}")
            except runner.refusal(error_type) as error:
                message = runner.message(error)
                failures.check(text in message, f"{name} {what}: wrong message {message}")
            failures.check(
                all(common.bits_equal(tables[k], problem.tables[k]) for k in tables),
                f"{name} {what}: a table was written",
            )
        frozen = problem.row_mask.copy()
        problem.row_mask[:] = False
        tables = problem.copy_tables()
        run(problem, tables)
        problem.row_mask[:] = frozen
        failures.check(
            all(common.bits_equal(tables[k], problem.tables[k]) for k in tables),
            f"{name} every row frozen: a table was written",
        )


# --- compact slots (a slot map) ------------------------------------------------------

_COMPACT_CASES = (  # rule, value dtype, index dtype, row size
    ("adam", "float32", np.int32, 24),
    ("momentum", "float64", np.int64, 5),
    ("rowwise_adam", "bfloat16", np.int64, 37),
    ("sgd", "float16", np.int32, 8),
)


def _check_untouched_compact(failures, name, problem, got):
    """Rows not stepped keep var's bits, slot rows no stepped row has keep
    the slots' bits, and the map changes only where a stepped row had none."""
    stepped = problem.permitted_rows()
    failures.check(
        common.bits_equal(got["var"][~stepped], problem.tables["var"][~stepped]),
        f"{name}: var changed on a frozen or absent row",
    )
    before_map, after_map = problem.slot_of_row, got["slot_of_row"]
    failures.check(
        common.bits_equal(
            after_map[~stepped | (before_map >= 0)], before_map[~stepped | (before_map >= 0)]
        ),
        f"{name}: slot_of_row changed where a row kept its slot row",
    )
    for key in problem.slot_names:
        owned = np.zeros(problem.tables[key].shape[0], bool)
        owned[after_map[stepped].astype(np.int64)] = True
        failures.check(
            common.bits_equal(got[key][~owned], problem.tables[key][~owned]),
            f"{name}: {key} changed on a slot row no stepped row has",
        )


def _compact_checks(backend, runner, rng, failures):
    """Compact slots: the CPU kernel against the unfused pair at the slot rows
    it gave; on a GPU, the map, its count and the tables against the CPU (new
    slot rows in order of first occurrence, so the same map); a map value
    that is not a slot row, a slot row of two rows and a bad count refused
    with nothing written."""
    rules = backend.rules
    for rule, value_dtype, index_dtype, row_size in _COMPACT_CASES:
        if rule not in rules:
            continue
        problem = BagRuleProblem(
            rng, rules, rule, value_dtype, index_dtype, row_size, True, compact=True
        )
        name = f"{backend.name} bag {rule} {value_dtype} {np.dtype(index_dtype).name} compact"
        cpu = problem.copy_tables()
        cpu_used = runner.cpu(problem, cpu)
        new_rows = problem.permitted_rows() & (problem.slot_of_row < 0)
        failures.check(
            cpu_used == problem.rows_used + int(new_rows.sum()),
            f"{name}: the CPU kernel counts {cpu_used} slot rows",
        )
        unfused = problem.copy_tables()
        runner.unfused_cpu(problem, unfused, cpu["slot_of_row"])
        for key in problem.tables:
            failures.check(
                common.bits_equal(cpu[key], unfused[key]),
                f"{name}: the CPU kernel's {key} differs from the unfused pair's",
            )
        _check_untouched_compact(failures, f"{name} cpu", problem, cpu)
        if not backend.on_gpu:
            continue
        gpu = problem.copy_tables()
        gpu_used = runner.gpu(problem, gpu)
        failures.check(gpu_used == cpu_used, f"{name}: {gpu_used} slot rows, CPU {cpu_used}")
        failures.check(
            common.bits_equal(gpu["slot_of_row"], cpu["slot_of_row"]),
            f"{name}: slot_of_row differs from the CPU's",
        )
        tables = {k: v for k, v in gpu.items() if k != "slot_of_row"}
        want = {k: v for k, v in cpu.items() if k != "slot_of_row"}
        compare_tables(failures, name, problem, tables, want, problem.tables)
        _check_untouched_compact(failures, name, problem, gpu)
    if isinstance(runner, _TensorFlowBagRule):
        _growth_check(backend, runner, rng, failures)
    elif backend.on_gpu:
        _grow_slot_check(backend, rng, failures)
    _compact_refusals(backend, runner, rng, failures)


def _growth_check(backend, runner, rng, failures):
    """Through the ops, whose kernels grow full compact slots: a step that
    needs more slot rows than the slots have grows them (by half at least,
    new rows at the initial value 0), on the GPU as on the CPU."""
    if "adam" not in backend.rules:
        return
    problem = BagRuleProblem(
        rng, backend.rules, "adam", "float32", np.int32, 8, True, compact=True, spare_slot_rows=1
    )
    name = f"{backend.name} bag adam compact, slots grown"
    cpu = problem.copy_tables()
    used = runner.cpu(problem, cpu)
    slot_rows = problem.tables["momentum"].shape[0]
    failures.check(
        used > slot_rows and cpu["momentum"].shape[0] >= max(used, slot_rows + slot_rows // 2 + 1),
        f"{name}: {used} slot rows used, the slots have {cpu['momentum'].shape[0]}",
    )
    if not backend.on_gpu:
        return
    gpu = problem.copy_tables()
    gpu_used = runner.gpu(problem, gpu)
    failures.check(
        gpu_used == used and all(common.bits_equal(gpu[k], cpu[k]) for k in cpu),
        f"{name}: the GPU's tables, map or count differ from the CPU's",
    )


def _compact_refusals(backend, runner, rng, failures):
    if "adam" not in backend.rules:
        return
    problem = BagRuleProblem(rng, backend.rules, "adam", "float32", np.int64, 8, True, compact=True)
    stepped = np.flatnonzero(problem.permitted_rows())
    first_row = int(problem.ids[np.isin(problem.ids, stepped)][0])
    later = [int(r) for r in stepped if r != first_row]
    half = problem.slot_of_row.copy()
    half[first_row] = 2.5
    shared = problem.slot_of_row.copy()  # Slot row 0 for two stepped rows only.
    shared[shared == 0.0] = -1.0
    shared[first_row] = shared[later[0]] = 0.0
    cases = [
        (
            "a map value that is not a slot row",
            half,
            problem.rows_used,
            f"slot_of_row[{first_row}] = 2.5",
        ),
        ("a slot row of two rows", shared, problem.rows_used, "both have slot row 0"),
        ("a negative count", problem.slot_of_row, -1, "rows_used: -1 slot rows"),
    ]
    runs = [("cpu", runner.cpu)] + ([(backend.name, runner.gpu)] if backend.on_gpu else [])
    for where, run in runs:
        for what, slot_of_row, rows_used, text in cases:
            name = f"{where} bag adam compact, {what}"
            tables = problem.copy_tables()
            tables["slot_of_row"] = slot_of_row.copy()
            before = {k: v.copy() for k, v in tables.items()}
            try:
                run(problem, tables, rows_used=rows_used)
                failures.check(False, f"{name}: no ValueError")
            except runner.refusal(ValueError) as error:
                message = runner.message(error)
                failures.check(text in message, f"{name}: wrong message {message}")
            failures.check(
                all(common.bits_equal(tables[k], before[k]) for k in tables),
                f"{name}: a table or the map was written",
            )


def _grow_slot_check(backend, rng, failures):
    """The module's view of the slots' growth (the ops grow through it): the
    old rows' bits kept, the new rows at the initial value, every dtype."""
    for value_dtype in common.VALUE_DTYPES:
        old = common.from_float(rng.standard_normal((5, 3)), value_dtype)
        grown = backend.to_device(np.tile(common.poison_bits(value_dtype), (8, 3)))
        backend.kernels.grow_slot_gpu(
            backend.to_device(old), grown, 0.25, dtype=common.dtype_argument(value_dtype)
        )
        got = backend.to_host(grown, old)
        failures.check(
            common.bits_equal(got[:5], old)
            and common.bits_equal(got[5:], common.from_float(np.full((3, 3), 0.25), value_dtype)),
            f"{backend.name} grow_slot_gpu {value_dtype}: old rows or new rows wrong",
        )
