"""build_tools/gpu_check*.py without a GPU: the rules' regrouping, the TensorFlow back end.

The GPU kernel sums a row's occurrences in pieces of RULE_GPU_PIECE_SIZE; the
check expects the CPU kernel's bits on the same step with each hotter row's
occurrences replaced by its pieces' sums. Here the CPU kernel stands in for
the GPU with that piece size: on exact (dyadic) gradients every grouping gives
the same sum, so the check must pass; on random gradients the hot rows' sums
differ in their last bits, so it must fail.

The TensorFlow back end (``--tensorflow-ops``) runs the suite through the
ops; on ``/CPU:0`` its CPU kernels must pass, and a wrong row must be seen.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BUILD_TOOLS = Path(__file__).resolve().parents[2] / "build_tools"
if not (BUILD_TOOLS / "gpu_check_rules.py").exists():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)
kernels = pytest.importorskip("partial_embedding._kernels")
sys.path.insert(0, str(BUILD_TOOLS))
gpu_check_rules = importlib.import_module("gpu_check_rules")
gpu_check_common = importlib.import_module("gpu_check_common")
gpu_check_bags = importlib.import_module("gpu_check_bags")  # main() imports it later.
gpu_check = importlib.import_module("gpu_check")
sys.path.remove(str(BUILD_TOOLS))

pytestmark = pytest.mark.random_inputs


class DyadicRng:
    """A generator whose normal draws are multiples of 1/16 in [-1/2, 1/2):
    float32 sums of a few thousand of them are exact."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def __getattr__(self, name: str):
        return getattr(self._rng, name)

    def standard_normal(self, shape):
        return self._rng.integers(-8, 8, size=shape) / 16.0


def cpu_standing_in_for_the_gpu():
    runner = gpu_check_rules.RuleRunner(gpu_check.CpuBackend(kernels))
    runner.piece_size = int(kernels.RULE_GPU_PIECE_SIZE)
    return runner


def test_the_piece_size_is_a_warp():
    assert kernels.RULE_GPU_PIECE_SIZE == 32


def test_large_checks_accept_exact_sums_and_see_regrouped_ones(rng):
    runner = cpu_standing_in_for_the_gpu()
    exact = gpu_check_common.Failures()
    gpu_check_rules.large_checks(runner, DyadicRng(rng), exact, quick=True)
    # The bfloat16 case rounds its sums (8 bits): only the float32 one is exact.
    float32 = [message for message in exact.messages if "float32" in message]
    assert exact.checks > 0 and float32 == []
    regrouped = gpu_check_common.Failures()
    gpu_check_rules.large_checks(runner, rng, regrouped, quick=True)
    assert any("float32" in message and "var differs" in message for message in regrouped.messages)


@pytest.mark.parametrize("rule", ["amsgrad", "rmsprop_centered_momentum", "rowwise_adam"])
@pytest.mark.parametrize("compact", [False, True])
def test_the_regrouped_cpu_step_matches_the_cpu_on_exact_sums(rng, rule, compact):
    runner = cpu_standing_in_for_the_gpu()
    problem = gpu_check_rules.RuleProblem(
        DyadicRng(rng), kernels.RULES, rule, "float32", np.int64, compact, True, hot=101
    )
    tables = problem.copy_tables()
    runner.run(problem, tables)
    failures = gpu_check_common.Failures()
    gpu_check_rules.compare_tables(failures, "hot row", problem, tables, runner.expected(problem))
    assert failures.checks > 0 and failures.messages == []


def test_every_rule_of_the_table_is_checked():
    rules = {case[0] for case in gpu_check_rules.rule_cases(kernels.RULES)}
    assert rules == set(kernels.RULES) and len(rules) == 13
    for rule in rules:
        cases = [case for case in gpu_check_rules.rule_cases(kernels.RULES) if case[0] == rule]
        assert {case[1] for case in cases} == set(gpu_check_common.VALUE_DTYPES)
        assert {case[2] for case in cases} == set(gpu_check_common.INDEX_DTYPES)
        if kernels.RULES[rule]["slots"]:
            assert {case[3] for case in cases} == {False, True}


def test_the_rowwise_bound_sees_a_wrong_statistic(rng):
    """A row-wise rule's var is compared within a bound: one that a step with
    another statistic (here: epsilon doubled) must exceed."""
    problem = gpu_check_rules.RuleProblem(
        rng, kernels.RULES, "rowwise_adagrad", "float32", np.int32, False, False
    )
    want = problem.copy_tables()
    gpu_check.CpuBackend(kernels).rule_cpu(problem, want, problem.indices, None, problem.gradient)
    problem.hyper[problem.hyper_names.index("epsilon")] *= 2
    got = problem.copy_tables()
    gpu_check.CpuBackend(kernels).rule_cpu(problem, got, problem.indices, None, problem.gradient)
    failures = gpu_check_common.Failures()
    gpu_check_rules.compare_tables(failures, "rowwise", problem, got, want, problem.tables)
    assert any("var" in message and "off by" in message for message in failures.messages)


def _moved_by_ulps(values: np.ndarray, changed: np.ndarray, rng, ulps: int) -> np.ndarray:
    """``values`` (float or bfloat16 bits) with each nonzero ``changed``
    element moved by ``ulps`` units in the last place, up or down at random."""
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[values.dtype.itemsize]
    bits = np.ascontiguousarray(values).copy().view(unsigned)
    sign = unsigned(1) << unsigned(8 * values.dtype.itemsize - 1)
    nonzero = changed & ((bits & ~sign) != 0)
    up = rng.random(bits.shape) < 0.5
    step = unsigned(ulps)
    moved = np.where(up, bits + step, bits - step)
    return np.where(nonzero, moved, bits).astype(unsigned).view(values.dtype)


def _ftrl_compared(problem, want, moved_keys, rng, ulps=1, relative=None) -> list[str]:
    """compare_tables' messages for ``want`` with ``moved_keys``' written
    elements moved by ``ulps`` (or by ``relative``)."""
    value_dtype = problem.value_dtype
    got = {key: table.copy() for key, table in want.items()}
    for key in moved_keys:
        written = ~gpu_check_rules.bits_equal_elements(want[key], problem.tables[key])
        assert written.any(), key
        if relative is None:
            got[key] = _moved_by_ulps(want[key], written, rng, ulps)
        else:
            wide = gpu_check_common.to_float64(want[key], value_dtype)
            got[key] = gpu_check_common.from_float(
                np.where(written, wide * (1 + relative), wide), value_dtype
            )
    failures = gpu_check_common.Failures()
    gpu_check_rules.compare_tables(failures, "ftrl", problem, got, want, problem.tables)
    assert failures.checks == len(want)
    return failures.messages


@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
@pytest.mark.parametrize("value_dtype", gpu_check_common.VALUE_DTYPES)
def test_the_ftrl_bound_takes_a_few_ulps_and_sees_more(rng, value_dtype, compact):
    """FTRL's var and linear are compared within ftrl_bound where the exponent
    takes pow (CUDA's powf against glibc's): an ulp of each element passes, 1%
    (32 ulps of a 16-bit type) fails; the
    accumulator, and every table where the exponent is 0.5, bit for bit."""
    backend = gpu_check.CpuBackend(kernels)
    for power, exact in ((0.75, False), (0.5, True)):
        problem = gpu_check_rules.RuleProblem(
            rng, kernels.RULES, "ftrl", value_dtype, np.int64, compact, True, (3, 4)
        )
        problem.hyper[problem.hyper_names.index("power")] = power
        assert gpu_check_rules.ftrl_takes_pow(problem) is not exact
        want = problem.copy_tables()
        backend.rule_cpu(problem, want, problem.indices, problem.slot_indices, problem.gradient)

        if exact:
            messages = _ftrl_compared(problem, want, ["var"], rng, ulps=1)
            assert messages == ["ftrl: var differs bit for bit"]
            continue
        assert _ftrl_compared(problem, want, ["var", "linear"], rng, ulps=1) == []
        messages = _ftrl_compared(problem, want, ["accumulator"], rng, ulps=1)
        assert messages == ["ftrl: accumulator differs bit for bit"]
        # 1%, and at least 32 ulps of a 16-bit type.
        relative = max(0.01, 64 * gpu_check_common.UNIT_ROUNDOFF[value_dtype])
        for key in ("var", "linear"):
            messages = _ftrl_compared(problem, want, [key], rng, relative=relative)
            assert len(messages) == 1 and f"ftrl: {key}[" in messages[0], messages


def test_the_model_sums_pieces_in_order(rng):
    failures = gpu_check_common.Failures()
    gpu_check_rules.check_model(rng, failures)
    assert failures.checks == 3 and failures.messages == []


def test_the_tensorflow_back_end_passes_on_the_cpu_and_sees_a_wrong_row(rng):
    pytest.importorskip("tensorflow")
    assert gpu_check.main(["--tensorflow-ops", "--device", "/CPU:0", "--quick"]) == 0

    class OffByALittle(gpu_check.TensorFlowBackend):
        """Adds 1e-3 to the first indexed row of every float32 result."""

        def scatter_sub(self, problem, var, deterministic):
            after, error = super().scatter_sub(problem, var, deterministic)
            if problem.value_dtype == "float32" and problem.indices.size and after.size:
                after[int(problem.indices.reshape(-1)[0])] += np.float32(1e-3)
            return after, error

    failures = gpu_check_common.Failures()
    gpu_check.correctness(OffByALittle("/CPU:0"), rng, True, failures)
    assert failures.checks > 100
    assert any("tf CPU:0 float32" in message for message in failures.messages), failures.messages
    assert not any("float64" in message for message in failures.messages)
