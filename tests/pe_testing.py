"""What the tests share: dtype lists, bit-for-bit comparison, seeded randomness,
the float64 reference of ``masked_scatter_sub`` and the fused rules' inputs.

Seeds. Every random draw in the tests comes from :func:`make_rng`, which mixes
one base seed with the name of the case, or from the global generators of
Python, NumPy, TensorFlow and Keras, which ``conftest.py`` seeds the same way
(:func:`seed_frameworks`) before each test. The base seed is fixed (0) unless
the environment variable ``PE_TEST_SEED`` says otherwise: an integer replays a
run, ``random`` draws a fresh one. The seed in use is printed, so pytest shows
it beside any failure; rerun with ``PE_TEST_SEED=<that value>`` to reproduce.

Importing this module does not import TensorFlow (the kernel-module tests run
without it under the sanitizers): the TensorFlow dtype lists are made on first
use, and only values of an already imported TensorFlow are recognized as such.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import random
import secrets
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypeVar

import numpy as np

_T = TypeVar("_T")

#: The table dtypes every kernel implements, by name (the same order as
#: ``VALUE_DTYPES``, for the TF-free kernel module and NumPy-side code).
VALUE_DTYPE_NAMES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
#: The index dtypes every op accepts, by name (the same order as ``INDEX_DTYPES``).
INDEX_DTYPE_NAMES: tuple[str, ...] = ("int32", "int64")
#: Unit roundoff of each value dtype: the relative error of one rounding.
UNIT_ROUNDOFF: dict[str, float] = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}

_UNSIGNED_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SEED_ENVIRONMENT = "PE_TEST_SEED"
_random_base: int | None = None


def __getattr__(name: str) -> Any:
    """``VALUE_DTYPES`` and ``INDEX_DTYPES``: TensorFlow dtypes, made on first use."""
    if name == "VALUE_DTYPES":
        import tensorflow as tf

        return tuple(tf.as_dtype(dtype_name) for dtype_name in VALUE_DTYPE_NAMES)
    if name == "INDEX_DTYPES":
        import tensorflow as tf

        return tuple(tf.as_dtype(dtype_name) for dtype_name in INDEX_DTYPE_NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- dtypes ----------------------------------------------------------------------


def dtype_name(dtype: Any) -> str:
    """The name of a TensorFlow, NumPy or ml_dtypes dtype (or of a name)."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str):  # tf.DType, np.dtype
        return name
    return np.dtype(dtype).name  # a scalar type such as np.float32


def numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a TensorFlow dtype or a dtype name (ml_dtypes' bfloat16)."""
    name = dtype_name(dtype)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def unit_roundoff(dtype: Any) -> float:
    """The unit roundoff of a value dtype (TensorFlow, NumPy or by name)."""
    return UNIT_ROUNDOFF[dtype_name(dtype)]


# --- seeds -----------------------------------------------------------------------


def base_seed() -> int:
    """The run's base seed: ``PE_TEST_SEED`` (an int, or ``random``), else 0."""
    global _random_base
    setting = os.environ.get(_SEED_ENVIRONMENT, "").strip()
    if not setting:
        return 0
    if setting.lower() == "random":
        if _random_base is None:
            _random_base = secrets.randbits(32)
        return _random_base
    try:
        return int(setting)
    except ValueError:
        raise ValueError(
            f"{_SEED_ENVIRONMENT}: expected an integer or 'random', got {setting!r}"
        ) from None


def seed_environment() -> dict[str, str]:
    """``PE_TEST_SEED`` set to this run's base seed, for a subprocess to draw
    the same values (``random`` would draw another base seed there), and
    ``PYTHONPATH`` led by this folder, so that a test file run as a script
    from its subfolder imports ``pe_testing``."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p)
    return {_SEED_ENVIRONMENT: str(base_seed()), "PYTHONPATH": path}


def once_per_run(tmp_path_factory: Any, key: str, compute: Callable[[], _T]) -> _T:
    """``compute()`` once per test run, for every pytest-xdist worker.

    A module-scoped fixture runs once in each worker that draws one of its
    tests. Wrapped in this, the first worker to ask computes the value (a
    measurement in a child process, a benchmark run) and pickles it into the
    run's shared temporary folder; another asks, waits for it under a file
    lock, and reads it. Without xdist it is ``compute()``. A ``compute`` that
    raises leaves nothing behind: the next one to ask tries again.

    Args:
        tmp_path_factory: pytest's fixture (its folder's parent is the run's,
            shared by the workers).
        key: Names the value within the run (e.g. the fixture and its param).
        compute: Makes the value; it must pickle.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    folder = tmp_path_factory.getbasetemp().parent / "once_per_run"
    folder.mkdir(exist_ok=True)
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    result = folder / f"{name}.pickle"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if result.exists():
            return pickle.loads(result.read_bytes())
        value = compute()
        result.write_bytes(pickle.dumps(value))
        return value


def run_script_report(script: str, environment: dict[str, str], timeout: int = 240) -> dict:
    """Runs a test file as a script in a fresh Python process and returns the
    JSON object its last line of output prints.

    The process sees this one's environment, :func:`seed_environment`,
    TensorFlow's C++ logging quieted, then ``environment`` over all of those.

    Args:
        script: Path of the file to run (a test file's ``__file__``).
        environment: Variables to set or replace in the process.
        timeout: Seconds the process may run before ``subprocess`` stops it.

    Returns:
        The decoded last line of the process's standard output.
    """
    full_environment = {
        **os.environ,
        **seed_environment(),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        **environment,
    }
    done = subprocess.run(
        [sys.executable, script],
        capture_output=True,
        text=True,
        env=full_environment,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run_as_main(module: str, arguments: list[str], monkeypatch: Any) -> int:
    """Runs ``python -m module *arguments`` in this process (``runpy``, as
    ``-m`` does, without the seconds a fresh interpreter spends importing
    TensorFlow) and returns its exit status; read what it printed with
    ``capsys``."""
    import runpy

    monkeypatch.setattr(sys, "argv", [module, *arguments])
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as exited:
        return exited.code if isinstance(exited.code, int) else 1
    return 0


def case_seed(*parts: object) -> int:
    """The seed of one case: the base seed mixed with the case's name."""
    return (base_seed() ^ zlib.crc32(repr(parts).encode())) % (2**63)


def make_rng(*parts: object) -> np.random.Generator:
    """A generator for the case named by ``parts``; prints how to replay it."""
    seed = case_seed(*parts)
    print(f"{_SEED_ENVIRONMENT}={base_seed()} (case seed {seed} for {parts!r})")
    return np.random.default_rng(seed)


#: The environment of a test script that runs on the CPU alone (logical CPU
#: devices, host memory): no GPU is visible to it.
CPU_ONLY_ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": ""}

_gpu_numerics_set = False


def exact_gpu_numerics() -> bool:
    """Where TensorFlow sees a GPU: float32 matmuls in float32 (no
    TensorFloat-32, whose 10-bit products break every float32 rounding bound
    the tests derive) and TensorFlow's deterministic kernels (the tests compare
    two paths bit for bit, which GPU sums with atomics in no fixed order cannot
    give). Set once per process, before the first test that imports
    TensorFlow; returns whether a GPU is seen. Users' GPU runs keep
    TensorFlow's defaults: they sum in whatever order, within rounding."""
    global _gpu_numerics_set
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    gpus = bool(tf.config.list_physical_devices("GPU"))
    if gpus and not _gpu_numerics_set:
        tf.config.experimental.enable_tensor_float_32_execution(False)
        tf.config.experimental.enable_op_determinism()
        _gpu_numerics_set = True
    return gpus


def seed_frameworks(*parts: object) -> int:
    """Seeds the global generators of Python, NumPy, and of TensorFlow and Keras
    where they are imported, for the case named by ``parts`` (initializers,
    ``tf.random`` ops, shuffling); prints how to replay it. Where TensorFlow
    sees a GPU, also sets :func:`exact_gpu_numerics`."""
    seed = case_seed(*parts) % 2**32  # NumPy's global seed is 32 bits.
    print(f"{_SEED_ENVIRONMENT}={base_seed()} (framework seed {seed} for {parts!r})")
    exact_gpu_numerics()
    if "keras" in sys.modules:
        sys.modules["keras"].utils.set_random_seed(seed)  # Python, NumPy, TF and Keras
        return seed
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global generator is what this seeds
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].random.set_seed(seed)
    return seed


@contextmanager
def global_dtype_policy(name: str) -> Iterator[None]:
    """Keras' global dtype policy set to ``name`` for the block (layers made
    inside it take it), the previous one restored after, even on error."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


# --- bit-for-bit comparison --------------------------------------------------------


def as_numpy(value: Any) -> np.ndarray:
    """A NumPy array of a tensor, variable (TF or Keras) or array-like."""
    if isinstance(value, np.ndarray):
        return value
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        if isinstance(value, (tf.Tensor, tf.Variable)):
            return value.numpy()
        inner = getattr(value, "value", None)
        if isinstance(inner, (tf.Tensor, tf.Variable)):
            return inner.numpy()
    return np.asarray(value)


def bits(value: Any) -> np.ndarray:
    """The raw bit patterns, so equal means bit-identical (NaN and -0 included).

    Always a copy: a later in-place write to ``value`` does not show in it.
    """
    array = np.array(as_numpy(value), order="C", copy=True)
    return array.view(_UNSIGNED_OF_WIDTH[array.dtype.itemsize])


def bits_equal(actual: Any, expected: Any) -> bool:
    """Same shape, same dtype, same bits."""
    actual, expected = as_numpy(actual), as_numpy(expected)
    return (
        actual.shape == expected.shape
        and actual.dtype == expected.dtype
        and actual.tobytes() == expected.tobytes()
    )


def assert_bits_equal(actual: Any, expected: Any, what: str = "values") -> None:
    """Fails naming how many elements differ and the first of them.

    ``expected`` is converted to ``actual``'s dtype first, so a float64
    reference that is exactly representable compares bit for bit.
    """
    actual = np.asarray(as_numpy(actual))
    expected = np.asarray(as_numpy(expected)).astype(actual.dtype)
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape} != expected {expected.shape}"
    )
    different = bits(actual) != bits(expected)
    assert not different.any(), (
        f"{what}: {int(different.sum())} element(s) differ (base seed {base_seed()}); "
        f"first at {np.argwhere(different)[0].tolist()}: "
        f"{actual[different][0]} != {expected[different][0]}"
    )


# --- the float64 reference of masked_scatter_sub -------------------------------------


class ScatterReference(NamedTuple):
    """``masked_scatter_sub`` done in float64, with what error bounds need."""

    #: ``var`` minus every permitted update, subtracted in index order.
    result: np.ndarray
    #: How many permitted updates each row received, shape ``[V]``.
    hits: np.ndarray
    #: ``|var|`` plus the magnitudes of the row's permitted updates: the
    #: largest magnitude the row's running value can reach.
    magnitude: np.ndarray


def skip_without_xla_custom_calls() -> None:
    """Skips the calling test module where the XLA custom-call library was not
    built (CMake ``PE_ENABLE_XLA_FFI``) or loaded too late to take effect."""
    import pytest

    from partial_embedding.ops import xla_custom_call

    if not os.path.exists(xla_custom_call.xla_library_path()):
        pytest.skip(
            "the XLA custom-call library was not built (PE_ENABLE_XLA_FFI=OFF)",
            allow_module_level=True,
        )
    if not xla_custom_call.load_xla_custom_calls():
        pytest.skip(
            "the XLA custom-call library loaded after this process's first XLA compilation",
            allow_module_level=True,
        )


def xla_handlers_emulated() -> bool:
    """Whether the XLA custom calls' Host handlers are the CUDA handlers' code
    on the SIMT emulator (``build_tools/simt_xla_check.sh`` loads that build
    through ``PARTIAL_EMBEDDING_XLA_LIBRARY``) rather than the CPU cores."""
    from partial_embedding.ops import xla_custom_call

    return xla_custom_call.handler_build() == "simt"


#: The rules whose GPU step may differ from the CPU kernel's bits
#: (cc/core/masked_sparse_apply_gpu.h): their row statistic is summed in
#: another order.
ROW_WISE_RULES = ("rowwise_adagrad", "rowwise_adam")


def assert_rule_step_as_the_kernel(
    rule: str,
    got: Any,
    kernel: Any,
    before: Any,
    what: str,
    per_row: bool = False,
    cuda: bool | None = None,
) -> None:
    """A table (or slot) after a step of ``rule`` taken by the XLA custom call
    equals the CPU kernel's: bit for bit, except for the var and per-row slot
    of a row-wise rule taken by the CUDA handlers (``cuda``: on a GPU, or by
    default where :func:`xla_handlers_emulated`).

    Their bound (masked_sparse_apply_gpu.h): the mean of squares over a row of
    n elements differs by at most 2 (n - 1) u relative, plus one rounding to
    the storage type; the per-row slot by that relative to itself; var's step
    lr * m / (sqrt(s) + eps) by half of it relative to the step, plus a few
    roundings of var (4 u |var|).
    """
    if cuda is None:
        cuda = xla_handlers_emulated()
    if not (cuda and rule in ROW_WISE_RULES):
        assert_bits_equal(got, kernel, what)
        return
    storage = dtype_name(as_numpy(kernel).dtype)
    compute_u = 2.0**-53 if storage == "float64" else 2.0**-24
    storage_u = unit_roundoff(storage)
    got, kernel, before = (as_numpy(x).astype(np.float64) for x in (got, kernel, before))
    row_size = int(np.prod(kernel.shape[1:])) if kernel.ndim > 1 else 1
    relative = 2 * max(row_size - 1, 1) * compute_u + storage_u
    if per_row:
        bound = (relative + storage_u) * np.abs(kernel)
    else:
        bound = relative / 2 * np.abs(kernel - before) + 4 * storage_u * np.abs(kernel)
    excess = np.abs(got - kernel) - bound
    assert np.all(excess <= 0), (
        f"{what}: {int(np.sum(excess > 0))} values beyond the GPU step's bound "
        f"(worst excess {float(np.max(excess)):.3g})"
    )


def assert_rule_tables_as_the_kernel(
    rule: str,
    compiled: Sequence[Any],
    kernel: Sequence[Any],
    before: Sequence[Any],
    cuda: bool | None = None,
) -> None:
    """var and the rule's slots after an XLA step equal the kernel path's
    (:func:`assert_rule_step_as_the_kernel` for each; ``cuda``: whether the
    CUDA handlers took the step, by default where they are emulated)."""
    from partial_embedding._internal.rule_table import RULES

    names = ["var", *(slot for slot, _ in RULES[rule].slots)]
    per_row = [False, *(row for _, row in RULES[rule].slots)]
    for name, row, got, other, start in zip(names, per_row, compiled, kernel, before):
        assert_rule_step_as_the_kernel(
            rule, got, other, start, f"{rule} {name}: XLA vs kernel", per_row=row, cuda=cuda
        )


def masked_scatter_sub_reference(
    var: Any, indices: Any, updates: Any, row_mask: Any
) -> ScatterReference:
    """``var[i] -= updates[k]`` for every position ``k`` with ``i = indices[k]``
    and ``row_mask[i]``, in float64."""
    result = np.asarray(var).astype(np.float64)
    row_shape = result.shape[1:]
    rows = np.asarray(indices).reshape(-1).astype(np.int64)
    flat_updates = np.asarray(updates).astype(np.float64).reshape((rows.size, *row_shape))
    keep = np.asarray(row_mask)[rows]
    magnitude = np.abs(result)
    np.subtract.at(result, rows[keep], flat_updates[keep])
    np.add.at(magnitude, rows[keep], np.abs(flat_updates[keep]))
    hits = np.bincount(rows[keep], minlength=result.shape[0])
    return ScatterReference(result, hits, magnitude)


def row_rule_configs() -> dict[str, Any]:
    """Factories of the Keras optimizers ``MaskedOptimizer`` wraps, one per
    rule and option the library implements (imports Keras when called)."""
    import keras

    import partial_embedding as pe

    return {
        "sgd": lambda: keras.optimizers.SGD(0.2),
        "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "sgd_nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True),
        "adam": lambda: keras.optimizers.Adam(0.05),
        "adam_amsgrad_decay": lambda: keras.optimizers.Adam(0.05, amsgrad=True, weight_decay=0.1),
        "adamw_clipnorm": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2, clipnorm=0.5),
        "adagrad": lambda: keras.optimizers.Adagrad(0.2),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.02),
        "rmsprop_momentum_centered": lambda: keras.optimizers.RMSprop(
            0.02, momentum=0.5, centered=True
        ),
        "rowwise_adagrad": lambda: pe.RowwiseAdagrad(0.2, initial_accumulator_value=0.1),
        "rowwise_adam_decay": lambda: pe.RowwiseAdam(0.05, weight_decay=0.1),
        "ftrl": lambda: keras.optimizers.Ftrl(**FTRL_OPTIONS),
    }


#: Ftrl with every option non-zero; its exponent (-learning_rate_power) is
#: exact in every dtype, as ftrl_reference's bound assumes.
FTRL_OPTIONS: dict[str, float] = dict(
    learning_rate=0.1,
    learning_rate_power=-0.75,
    initial_accumulator_value=0.2,
    l1_regularization_strength=0.01,
    l2_regularization_strength=0.02,
    l2_shrinkage_regularization_strength=0.01,
    beta=0.1,
)


def spy_on_the_fused_rule(monkeypatch: Any) -> list[str]:
    """Records the rule of every fused rule step MaskedOptimizer takes (the
    op, or its XLA custom call), in the list returned."""
    from partial_embedding.optimizers import _row_rules as row_rules

    calls: list[str] = []
    for module, name in (
        (row_rules, "masked_sparse_apply_rule"),
        (row_rules.xla_custom_call, "masked_sparse_apply_rule_custom_call"),
    ):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, **k: calls.append(a[0]) or _real(*a, **k)
        )
    return calls


# --- the fused kernels' rules ----------------------------------------------------------

_FUSED_HYPERPARAMETER_VALUES: dict[str, float] = {
    "learning_rate": 0.01,
    "weight_decay": 0.004,
    "momentum": 0.9,
    "epsilon": 1e-7,
    "rho": 0.9,
    "one_minus_rho": 0.1,
    "one_minus_beta_1": 0.1,
    "one_minus_beta_2": 0.001,
    "alpha": 0.003,
    "one_minus_beta_1_power": 0.19,
    "one_minus_beta_2_power": 0.002,
    "l1": 0.01,
    "two_l2_shrinkage": 0.02,
    "two_l2": 0.2,
    "power": 0.5,
}


def fused_hyperparameters(names: tuple[str, ...]) -> dict[str, float]:
    """A plausible value of each of a fused rule's hyperparameters
    (``KernelRule.hyperparameters``), by name; weight decay on."""
    return {name: _FUSED_HYPERPARAMETER_VALUES[name] for name in names}


def rule_hyperparameters(
    rng: np.random.Generator, rule: str, dtype: str, decay: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """A fused rule's hyperparameters, each drawn near
    :func:`fused_hyperparameters`' value (weight decay ``decay``), as
    TensorFlow scalars of ``dtype`` for the op and their values (as the dtype
    holds them) for :func:`rule_reference_step`."""
    import tensorflow as tf

    from partial_embedding._internal.rule_table import RULES

    tensors, values = {}, {}
    for name, value in fused_hyperparameters(RULES[rule].hyperparameters).items():
        if name == "weight_decay":
            value = decay
        elif name == "epsilon" and dtype in ("float16", "bfloat16"):
            value = 1e-3  # 1e-7 is below float16's range
        else:
            value *= rng.uniform(0.8, 1.2)
        tensors[name] = tf.constant(value, dtype)
        values[name] = float(tf.cast(tensors[name], tf.float64))
    return tensors, values


def fused_slot_values(
    slots: tuple[tuple[str, bool], ...], rng: np.random.Generator, rows: int, width: int, dtype: Any
) -> list[np.ndarray]:
    """Starting values of a fused rule's slots (``KernelRule.slots``: name,
    per_row) with ``rows`` rows: signed for the momentum, FTRL's linear and
    the average gradient, positive for the second moments and accumulators,
    the averages small so that centered RMSprop's ``velocity - average**2``
    stays positive."""
    values = []
    for name, per_row in slots:
        draw = rng.standard_normal([rows] if per_row else [rows, width])
        if name == "average_gradient":
            draw *= 0.05
        elif name not in ("momentum", "linear"):
            draw = np.abs(draw) + 0.1
        values.append(draw.astype(dtype))
    return values


def masked_fit_problem(
    rng: np.random.Generator, vocab: int, width: int, ids_per_sample: int, samples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A small regression problem for an embedding model: a float32 table, a
    bool mask permitting a quarter of its rows, int32 ids and float32
    targets."""
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    permitted = np.zeros(vocab, bool)
    permitted[rng.choice(vocab, vocab // 4, replace=False)] = True
    x = rng.integers(0, vocab, size=(samples, ids_per_sample)).astype(np.int32)
    y = rng.normal(size=(samples, 1)).astype(np.float32)
    return table, permitted, x, y


def defined_names(tree: Any) -> set[str]:
    """Names a syntax tree defines itself: functions, classes, assigned names
    and attributes, imports' aliases, arguments and keywords (so an
    ``obj._name`` that no tree defines is someone else's private member)."""
    import ast

    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def buffer_address(variable: Any) -> int:
    """Address of what a read of a TensorFlow variable (or tensor) returns,
    through DLPack, without a copy: equal for two reads while reads alias
    the variable's buffer (in copy-on-read mode each read is a new copy)."""
    import tensorflow as tf

    capsule = tf.experimental.dlpack.to_dlpack(tf.convert_to_tensor(variable))

    class _Exporter:
        def __dlpack__(self, **_: Any) -> Any:
            return capsule

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    return int(np.from_dlpack(_Exporter()).ctypes.data)


# --- Adam through the rule table's ops (the table's "adam" / "amsgrad") -----------


def masked_sparse_apply_adam(
    var: Any, m: Any, v: Any, indices: Any, grad: Any, row_mask: Any, *, learning_rate: Any,
    beta_1: Any, beta_2: Any, epsilon: Any, alpha: Any, weight_decay: Any = 0.0,
    v_hat: Any = None, slot_indices: Any = None, **kwargs: Any,
) -> Any:  # fmt: skip
    """``ops.masked_sparse_apply_rule`` with Adam's rule (AMSGrad with ``v_hat``)
    and Adam's hyperparameters by their usual names."""
    from partial_embedding._internal.rule_inputs import adam_hyperparameters
    from partial_embedding.ops import masked_sparse_apply_rule

    return masked_sparse_apply_rule(
        "adam" if v_hat is None else "amsgrad",
        var,
        [m, v] if v_hat is None else [m, v, v_hat],
        indices,
        grad,
        row_mask,
        adam_hyperparameters(learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay),
        slot_indices=slot_indices,
        **kwargs,
    )


def masked_embedding_bag_apply_adam(
    var: Any, m: Any, v: Any, grad: Any, ids: Any, bags: Any, factors: Any, row_mask: Any, *,
    learning_rate: Any, beta_1: Any, beta_2: Any, epsilon: Any, alpha: Any,
    weight_decay: Any = 0.0, v_hat: Any = None, slot_of_row: Any = None,
    slot_rows_used: Any = None,
) -> Any:  # fmt: skip
    """``ops.fused.masked_embedding_bag_apply_rule`` with Adam's rule."""
    from partial_embedding._internal.rule_inputs import adam_hyperparameters
    from partial_embedding.ops.fused import masked_embedding_bag_apply_rule

    return masked_embedding_bag_apply_rule(
        "adam" if v_hat is None else "amsgrad",
        var,
        [m, v] if v_hat is None else [m, v, v_hat],
        grad,
        ids,
        bags,
        factors,
        row_mask,
        adam_hyperparameters(learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay),
        slot_of_row=slot_of_row,
        slot_rows_used=slot_rows_used,
    )


def sharding_creator(num_rows: int, shard_rows: tuple[int, ...]) -> Callable[..., Any]:
    """A ``tf.variable_creator_scope`` creator under which every variable of
    ``num_rows`` rows becomes a ``ShardedVariable`` of ``shard_rows`` rows a
    shard (what ParameterServerStrategy does with a partitioner, on this
    machine); other variables are made as usual."""
    import tensorflow as tf
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    def creator(next_creator: Any, **kwargs: Any) -> Any:
        initial = kwargs["initial_value"]
        value = tf.convert_to_tensor(initial() if callable(initial) else initial)
        if value.shape.rank < 1 or value.shape[0] != num_rows:
            return next_creator(**kwargs)
        shards, start = [], 0
        for index, rows in enumerate(shard_rows):
            part = value[start : start + rows]
            shards.append(
                next_creator(
                    **{
                        **kwargs,
                        "initial_value": part,
                        "shape": part.shape,
                        "name": f"part_{index}",
                    }
                )
            )
            start += rows
        return ShardedVariable(shards)

    return creator


# --- the fused rules' reference: every operation rounded as the kernel rounds it -----


def round_to(value: Any, dtype: Any) -> np.ndarray:
    """Float64 values rounded as one operation of a kernel on ``dtype`` rounds
    them: to the compute type (float32 for the 16-bit types), then to
    ``dtype``. Rounding a float64 result of +, -, *, / or sqrt of such values
    gives the correctly rounded result in that type (53 >= 2 * 24 + 2), so a
    reference built of this is exact."""
    value = np.asarray(value, np.float64)
    if dtype_name(dtype) in ("float16", "bfloat16"):
        value = value.astype(np.float32)
    return value.astype(numpy_dtype(dtype)).astype(np.float64)


def summed_rows(
    indices: Any, grad: Any, row_mask: Any, dtype: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The permitted rows of a per-id step in order of first occurrence and
    each one's gradient, summed in position order with each addition rounded
    to ``dtype`` (as the kernels sum them): ``(rows, g)``, g ``[rows, width]``."""
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    width = int(np.prod(np.shape(grad)[np.ndim(indices) :], dtype=np.int64))
    values = np.asarray(grad).astype(np.float64).reshape(flat.size, width)
    rows = np.array([r for r in dict.fromkeys(flat.tolist()) if row_mask[r]], np.int64)
    g = np.zeros((rows.size, values.shape[1]))
    positions = [np.flatnonzero(flat == row) for row in rows]
    for k in range(max((p.size for p in positions), default=0)):
        at = np.array([i for i, p in enumerate(positions) if p.size > k], np.int64)
        g[at] = round_to(g[at] + values[[positions[i][k] for i in at]], dtype)
    return rows, g


def _row_mean_square(g: np.ndarray, dtype: Any) -> np.ndarray:
    """cc/core/row_rules.h's RowMeanSquare: each square rounded to ``dtype``,
    summed in the compute type in eight lanes (column j in lane j % 8), the
    lanes added pairwise, the mean rounded to ``dtype``."""
    compute = np.float64 if dtype_name(dtype) == "float64" else np.float32
    squares = round_to(g * g, dtype).astype(compute)
    sums = np.zeros((g.shape[0], 8), compute)
    for j in range(g.shape[1]):
        sums[:, j % 8] = sums[:, j % 8] + squares[:, j]
    for width in (4, 2, 1):
        sums[:, :width] = sums[:, :width] + sums[:, width : 2 * width]
    return round_to(sums[:, 0].astype(np.float64) / g.shape[1], dtype)


def rule_reference_step(
    rule: str,
    var: np.ndarray,
    slots: Sequence[np.ndarray],
    rows: np.ndarray,
    g: np.ndarray,
    hyperparameters: dict[str, float],
    dtype: Any,
    slot_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One step of a fused kernel's ``rule`` on float64 copies of ``var`` and
    its ``slots`` (the table's order; per-row slots of shape ``[rows]``), for
    the distinct permitted ``rows`` with their summed gradients ``g`` (values
    of ``dtype``) and the ``hyperparameters`` by the table's names (values of
    ``dtype``): cc/core/row_rules.h's ElementStep and RowStatistic, every
    operation rounded by :func:`round_to` in the kernel's order. Exact (the
    kernel matches it bit for bit) for every rule but FTRL, whose pow is the
    math library's (:func:`ftrl_reference` bounds it). ``slot_rows``: each
    row's slot row (compact slots); by default the row itself."""
    assert rule != "ftrl", "FTRL's pow is not correctly rounded: use ftrl_reference"

    def r(value: Any) -> np.ndarray:
        return round_to(value, dtype)

    h = {"weight_decay": 0.0, **hyperparameters}
    shape, slot_shapes = var.shape, [s.shape for s in slots]
    var = var.astype(np.float64).reshape(shape[0], -1)
    slots = [s.astype(np.float64).reshape(s.shape[0], -1) for s in slots]
    rows = np.asarray(rows, np.int64)
    at = rows if slot_rows is None else np.asarray(slot_rows, np.int64)
    g = np.asarray(g, np.float64).reshape(rows.size, var.shape[1])
    lr, eps = h["learning_rate"], h.get("epsilon", 0.0)
    x = var[rows]
    if h["weight_decay"] != 0:
        x = r(x - r(r(x * h["weight_decay"]) * lr))
    if rule == "sgd":
        x = r(x - r(g * lr))
    elif rule in ("momentum", "nesterov"):
        m = r(r(slots[0][at] * h["momentum"]) - r(g * lr))
        slots[0][at] = m
        x = r(x + (r(r(m * h["momentum"]) - r(g * lr)) if rule == "nesterov" else m))
    elif rule == "adagrad":
        accumulator = r(slots[0][at] + r(g * g))
        slots[0][at] = accumulator
        x = r(x - r(r(lr * g) / r(np.sqrt(r(accumulator + eps)))))
    elif rule.startswith("rmsprop"):
        rho, one_minus_rho = h["rho"], h["one_minus_rho"]
        velocity = r(r(rho * slots[0][at]) + r(one_minus_rho * r(g * g)))
        slots[0][at] = velocity
        if "centered" in rule:
            average_slot = slots[2 if rule.endswith("momentum") else 1]
            average = r(r(rho * average_slot[at]) + r(one_minus_rho * g))
            average_slot[at] = average
            denominator = r(r(velocity - r(average * average)) + eps)
        else:
            denominator = r(velocity + eps)
        increment = r(r(lr * g) / r(np.sqrt(denominator)))
        if rule.endswith("momentum"):
            increment = r(r(h["momentum"] * slots[1][at]) + increment)
            slots[1][at] = increment
        x = r(x - increment)
    elif rule in ("adam", "amsgrad", "rowwise_adam"):
        m = r(slots[0][at] + r(r(g - slots[0][at]) * h["one_minus_beta_1"]))
        slots[0][at] = m
        if rule == "rowwise_adam":
            v_old = slots[1][at][:, 0]
            v = r(v_old + r(r(_row_mean_square(g, dtype) - v_old) * h["one_minus_beta_2"]))
            slots[1][at] = v[:, None]
            denominator = r(r(np.sqrt(r(v / h["one_minus_beta_2_power"]))) + eps)
            factor = r(lr / r(h["one_minus_beta_1_power"] * denominator))
            x = r(x - r(m * factor[:, None]))
        else:
            v = r(slots[1][at] + r(r(r(g * g) - slots[1][at]) * h["one_minus_beta_2"]))
            slots[1][at] = v
            if rule == "amsgrad":
                v = np.maximum(slots[2][at], v)
                slots[2][at] = v
            x = r(x - r(r(m * h["alpha"]) / r(r(np.sqrt(v)) + eps)))
    else:
        assert rule == "rowwise_adagrad", rule
        accumulator = r(slots[0][at][:, 0] + _row_mean_square(g, dtype))
        slots[0][at] = accumulator[:, None]
        factor = r(lr / r(r(np.sqrt(accumulator)) + eps))
        x = r(x - r(g * factor[:, None]))
    var[rows] = x
    return var.reshape(shape), [s.reshape(old) for s, old in zip(slots, slot_shapes)]


# --- FTRL's float64 reference, with a running bound on the rounding ----------------

#: How far a library's pow may be from the exact power, in ulps of the compute
#: type: glibc's pow and powf are within 1, CUDA's powf within 4 and pow
#: within 2 (the CUDA C++ Programming Guide's table), TensorFlow's (Eigen's)
#: within a few. 4 covers them all.
POW_ULPS = 4


class Bounded(NamedTuple):
    """Float64 values and a bound on how far a rounded computation of them
    may lie from them (running error analysis: each operation adds its input
    errors' effect and one rounding of its result)."""

    value: np.ndarray
    error: np.ndarray


def exact(value: Any) -> Bounded:
    """A value known exactly (no error)."""
    value = np.asarray(value, np.float64)
    return Bounded(value, np.zeros_like(value))


class RoundedArithmetic:
    """Float64 arithmetic that tracks the error of the same operations each
    rounded to nearest in ``dtype`` (computed in float32 for the 16-bit
    types: two roundings, hence ``eps`` slightly above the unit roundoff)."""

    def __init__(self, dtype: Any) -> None:
        name = dtype_name(dtype)
        compute_u = 2.0**-53 if name == "float64" else 2.0**-24
        self.eps = unit_roundoff(name) + compute_u + unit_roundoff(name) * compute_u
        # pow: POW_ULPS ulps of the compute type (2 * u each), then the
        # rounding to the storage type.
        self.pow_eps = 2 * POW_ULPS * compute_u + self.eps

    def constant(self, value: float) -> Bounded:
        """A Python number converted once to the dtype."""
        return Bounded(np.asarray(value, np.float64), np.asarray(self.eps * abs(value)))

    def _round(self, value: np.ndarray, propagated: np.ndarray, eps: float) -> Bounded:
        return Bounded(value, propagated + eps * (np.abs(value) + propagated))

    def add(self, a: Bounded, b: Bounded) -> Bounded:
        return self._round(a.value + b.value, a.error + b.error, self.eps)

    def sub(self, a: Bounded, b: Bounded) -> Bounded:
        return self._round(a.value - b.value, a.error + b.error, self.eps)

    def mul(self, a: Bounded, b: Bounded) -> Bounded:
        propagated = np.abs(a.value) * b.error + np.abs(b.value) * a.error + a.error * b.error
        return self._round(a.value * b.value, propagated, self.eps)

    def div(self, a: Bounded, b: Bounded) -> Bounded:
        value = a.value / b.value
        room = np.abs(b.value) - b.error
        with np.errstate(divide="ignore", invalid="ignore"):
            propagated = np.where(room > 0, (a.error + np.abs(value) * b.error) / room, np.inf)
        return self._round(value, propagated, self.eps)

    def pow(self, a: Bounded, exponent: float) -> Bounded:
        """``a ** exponent`` for ``a >= 0`` and an exponent the dtype holds
        exactly (the power is monotonic in ``a``: its error is the larger
        change over ``[a - e, a + e]``)."""
        value = a.value**exponent
        low = np.maximum(a.value - a.error, 0.0) ** exponent
        high = (a.value + a.error) ** exponent
        propagated = np.maximum(np.abs(high - value), np.abs(value - low))
        return self._round(value, propagated, self.pow_eps)

    def clip(self, a: Bounded, bound: Bounded) -> Bounded:
        """``clip(a, -bound, bound)``: 1-Lipschitz in ``a`` and in ``bound``."""
        return Bounded(np.clip(a.value, -bound.value, bound.value), a.error + bound.error)

    def summed(self, values: np.ndarray) -> Bounded:
        """The sum over axis 0 of values the dtype holds exactly, added in
        any order, each addition rounded: within ``(k - 1) eps sum|v|``."""
        values = np.asarray(values, np.float64)
        count = values.shape[0]
        error = (count - 1) * self.eps * (1 + count * self.eps) * np.abs(values).sum(axis=0)
        return Bounded(values.sum(axis=0), error)


def ftrl_row_step(
    arithmetic: RoundedArithmetic,
    optimizer: Any,
    x: Bounded,
    g: Bounded,
    accumulator: Bounded,
    linear: Bounded,
) -> tuple[Bounded, Bounded, Bounded]:
    """One lazy step of ``keras.optimizers.Ftrl``'s update_step (after its
    decoupled weight decay) on a row: the new (var, accumulator, linear),
    each with its bound. The learning rate as Keras keeps it (float32)."""
    r = arithmetic
    lr = r.constant(float(np.float32(float(optimizer.learning_rate))))
    if optimizer.weight_decay:
        decay = r.constant(float(np.float32(optimizer.weight_decay)))
        x = r.sub(x, r.mul(r.mul(x, decay), lr))
    power = -float(optimizer.learning_rate_power)
    two_l2 = r.mul(
        exact(2.0),
        r.add(
            r.constant(optimizer.l2_regularization_strength),
            r.div(r.constant(optimizer.beta), r.mul(exact(2.0), lr)),
        ),
    )
    updated = r.add(accumulator, r.mul(g, g))
    power_new = r.pow(updated, power)
    sigma = r.div(r.sub(power_new, r.pow(accumulator, power)), lr)
    shrunk = r.add(g, r.mul(r.constant(2 * optimizer.l2_shrinkage_regularization_strength), x))
    linear = r.add(linear, r.sub(shrunk, r.mul(sigma, x)))
    quadratic = r.add(r.div(power_new, lr), two_l2)
    l1 = r.constant(optimizer.l1_regularization_strength)
    x = r.div(r.sub(r.clip(linear, l1), linear), quadratic)
    return x, updated, linear


def ftrl_reference(
    optimizer: Any,
    table: np.ndarray,
    mask: np.ndarray,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    dtype: Any,
    accumulator: np.ndarray | None = None,
    linear: np.ndarray | None = None,
) -> dict[str, Bounded]:
    """Lazy FTRL over ``batches`` of (ids, gradient rows) on the permitted
    rows of ``table``: var, accumulator and linear with their bounds. The
    slots start at Keras' values (the initial accumulator value through
    float32, as Keras' Constant initializer casts it) unless given."""
    r = RoundedArithmetic(dtype)
    storage = numpy_dtype(dtype)
    rows, width = table.shape[0], int(np.prod(table.shape[1:], dtype=np.int64))
    init = float(np.asarray(np.float32(optimizer.initial_accumulator_value)).astype(storage))
    state = {
        "var": exact(table.astype(np.float64).reshape(rows, width)),
        "accumulator": exact(
            np.full((rows, width), init)
            if accumulator is None
            else accumulator.astype(np.float64).reshape(rows, width)
        ),
        "linear": exact(
            np.zeros((rows, width))
            if linear is None
            else linear.astype(np.float64).reshape(rows, width)
        ),
    }
    for ids, values in batches:
        ids = np.asarray(ids).reshape(-1)
        values = np.asarray(values).astype(np.float64).reshape(ids.size, width)
        for row in dict.fromkeys(int(i) for i in ids):
            if not mask[row]:
                continue
            g = r.summed(values[ids == row])
            x, accumulator_row, linear_row = (
                Bounded(state[name].value[row], state[name].error[row])
                for name in ("var", "accumulator", "linear")
            )
            step = ftrl_row_step(r, optimizer, x, g, accumulator_row, linear_row)
            for name, new in zip(("var", "accumulator", "linear"), step):
                state[name].value[row] = new.value
                state[name].error[row] = new.error
    shape = table.shape
    return {
        name: Bounded(b.value.reshape(shape), b.error.reshape(shape)) for name, b in state.items()
    }


def assert_within_bound(actual: Any, expected: Bounded, what: str) -> None:
    """Every value of ``actual`` lies within ``expected``'s bound of its value."""
    actual = as_numpy(actual).astype(np.float64)
    excess = np.abs(actual - expected.value) - expected.error
    assert np.all(excess <= 0), (
        f"{what}: {int(np.sum(excess > 0))} values beyond the bound (worst excess "
        f"{float(np.nanmax(excess)):.3g}, worst |error| / bound "
        f"{float(np.nanmax(np.abs(actual - expected.value) / expected.error)):.3g})"
    )


# --- rounding bounds ---------------------------------------------------------------


def rounding_gamma(roundings: Any, dtype: Any) -> Any:
    """``gamma(n) = n u / (1 - n u)`` for ``n`` roundings in ``dtype``: the
    relative error of n rounded operations (Higham, Accuracy and Stability of
    Numerical Algorithms, 3.1)."""
    n = np.asarray(roundings, np.float64)
    unit = unit_roundoff(dtype)
    return n * unit / (1 - n * unit)


def assert_within_rounding(
    actual: Any, exact: Any, magnitude: Any, roundings: Any, dtype: Any, what: str = "values"
) -> None:
    """``|actual - exact| <= gamma(roundings) * magnitude`` element by element.

    ``magnitude`` is the sum of the absolute values of the terms the result
    was computed from (``sum |a_i b_i|`` for a dot product, ``|a| + |b|`` for a
    difference), so the bound holds however far the terms cancel: a relative
    tolerance on the result alone fails on the seed whose result nearly
    cancels. ``roundings`` (a scalar or one per element, broadcast) counts the
    rounded operations on the longest path, those of the reference too when it
    is not exact."""
    actual = np.asarray(actual, np.float64)
    exact = np.asarray(exact, np.float64)
    bound = rounding_gamma(roundings, dtype) * np.asarray(magnitude, np.float64)
    error = np.abs(actual - exact)
    bad = ~(error <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} element(s) outside the rounding bound; first at "
        f"{np.argwhere(bad)[0].tolist()}: {actual[bad][0]!r} vs {exact[bad][0]!r}, "
        f"error {error[bad][0]:.3g} > bound {np.broadcast_to(bound, bad.shape)[bad][0]:.3g}"
    )


# --- rotations ---------------------------------------------------------------------


def rotated_cases(
    names: Sequence[str],
    values: Sequence[Any],
    per_name: int = 2,
    include: dict[str, Sequence[Any]] | None = None,
) -> list[tuple[str, Any]]:
    """``(name, value)`` cases in which each name meets ``per_name`` of the
    values, rotating so that every value meets as many names: name ``i`` gets
    values ``i``, ``i + len(values) // per_name``, ... (modulo their count),
    plus the values ``include`` names for it. For a model-level test whose
    rule x dtype product is already met whole at the kernel level
    (``tests/optimizers/test_fused_rules.py`` runs every rule in every dtype):
    with four dtypes and ``per_name=2``, every rule meets one 16-bit and one
    wider dtype, and every dtype about half the rules."""
    step = max(len(values) // per_name, 1)
    cases = []
    for i, name in enumerate(names):
        chosen = [values[(i + k * step) % len(values)] for k in range(per_name)]
        chosen += [value for value in (include or {}).get(name, ()) if value not in chosen]
        cases += [(name, value) for value in chosen]
    return cases
