"""Shared test setup.

- TensorFlow's C++ logging is quieted before anything imports TensorFlow.
- Seeds (see ``pe_testing``): the ``rng`` fixture is a NumPy generator seeded
  from ``PE_TEST_SEED`` (default 0, so fixed) and the test's id; before each
  test the global generators of Python, NumPy, TensorFlow and Keras are seeded
  the same way, so initializers, ``tf.random`` ops and shuffling repeat too.
  The seed is printed and shown beside a failure: ``PE_TEST_SEED=<int>``
  replays a run, ``PE_TEST_SEED=random`` draws fresh values (opt-in).
- ``gpu`` tests need a GPU that TensorFlow sees and are skipped elsewhere;
  the other tests run wherever TensorFlow places their ops (those about the
  CPU kernels pin ``/CPU:0`` themselves).
- Hypothesis (``test_properties.py``) runs under the ``ci`` profile unless
  ``HYPOTHESIS_PROFILE`` names another: derandomized (the same examples every
  run, so it cannot flake), no deadline (the first call of an op traces it),
  no example database (nothing written into the tree).
  ``HYPOTHESIS_PROFILE=dev`` explores new random examples on every run.

- Python's cyclic garbage collector is told, after collection and then
  every ``_TESTS_BETWEEN_FREEZES`` tests, that what is alive then stays
  (``gc.freeze()``): see ``pytest_runtest_teardown``.

Nothing here imports TensorFlow: ``build_tools/sanitize.sh`` runs
``test_kernel_module.py`` under the sanitizers without it.
"""

import gc
import os
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pe_testing import make_rng, seed_frameworks  # noqa: E402

try:
    from hypothesis import settings
except ImportError:  # Only test_properties.py needs it.
    pass
else:
    settings.register_profile("ci", derandomize=True, deadline=None, database=None, max_examples=60)
    settings.register_profile(
        "dev", derandomize=False, deadline=None, database=None, max_examples=60
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from ``PE_TEST_SEED`` (default 0) and the test's id."""
    return make_rng(request.node.nodeid)


@pytest.fixture
def on_cpu() -> Iterator[None]:
    """Places the test's variables and ops on the CPU: for modules that test
    the CPU kernels (``pytestmark = pytest.mark.usefixtures("on_cpu")``), so
    that they test the same thing where TensorFlow also sees a GPU."""
    import tensorflow as tf

    with tf.device("/CPU:0"):
        yield


@pytest.fixture(autouse=True)
def _seeded_frameworks(request: pytest.FixtureRequest) -> None:
    """Seeds the global generators (Python, NumPy, TensorFlow, Keras) per test."""
    seed_frameworks(request.node.nodeid)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: runs processes or a whole benchmark or demo (tens of seconds); the README's "
        "command leaves them out (pyproject addopts), CI runs them as a step of their own",
    )
    config.addinivalue_line(
        "markers",
        "gpu: needs a GPU that TensorFlow sees (skipped without one, e.g. in CI); "
        "`-m gpu` runs only these",
    )
    config.addinivalue_line(
        "markers",
        "random_inputs: draws its inputs from the seed: takes the `rng` fixture or its module "
        "calls `make_rng` (set automatically); "
        "CI reruns these on a fresh printed seed (`PE_TEST_SEED=random -m random_inputs`)",
    )


def _module_draws_from_the_seed(path: str, seen: dict[str, bool]) -> bool:
    """True for a test module that calls ``make_rng`` itself (in helpers or
    in a script it runs as a subprocess), not only through the fixture."""
    if path not in seen:
        with open(path, encoding="utf-8") as source:
            seen[path] = "make_rng(" in source.read()
    return seen[path]


_gpus_seen: bool | None = None


def _tensorflow_sees_a_gpu() -> bool:
    """Whether TensorFlow sees a GPU (imported only when a ``gpu`` test was
    collected, so modules that need no TensorFlow still run without it)."""
    global _gpus_seen
    if _gpus_seen is None:
        try:
            import tensorflow as tf
        except ImportError:
            _gpus_seen = False
        else:
            _gpus_seen = bool(tf.config.list_physical_devices("GPU"))
    return _gpus_seen


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks as ``random_inputs`` every test that takes the ``rng`` fixture,
    and every test of a module that draws from the seed with ``make_rng``;
    skips the ``gpu`` tests where TensorFlow sees no GPU."""
    seen: dict[str, bool] = {}
    no_gpu = pytest.mark.skip(reason="needs a GPU that TensorFlow sees")
    for item in items:
        if item.get_closest_marker("gpu") is not None and not _tensorflow_sees_a_gpu():
            item.add_marker(no_gpu)
        path = str(getattr(item, "path", ""))
        if "rng" in getattr(item, "fixturenames", ()) or (
            path.endswith(".py") and _module_draws_from_the_seed(path, seen)
        ):
            item.add_marker(pytest.mark.random_inputs)


#: How many tests run between two ``gc.freeze()`` calls.
_TESTS_BETWEEN_FREEZES = 10
_tests_since_freeze = 0


def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()


#: Python's third collection threshold while the tests run (its default is 10):
#: how many generation-1 collections pass before a full one may run. See
#: ``pytest_collection_finish``.
_FULL_COLLECTION_THRESHOLD = 100


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freezes what collection made (TensorFlow, Keras, the test modules),
    and makes Python's own full collections rarer.

    Between two freezes the tests still set off full collections often: in
    one process running ``tests/optimizers`` and
    ``test_quantized_reversible.py`` (250 s, 2026-12-05; freezes every 40
    tests then) 117 full collections took 9.8 s, about 85 ms each, each
    scanning what the tests had made since the last freeze. Most are not
    Python's: Keras' ``Layer.__delattr__`` calls ``gc.collect()`` whenever a
    variable attribute is deleted, as ``quantize()`` does. This threshold took
    the count to 97; freezing every 10 tests instead of 40 made each cheaper:
    5.2 s in all. The collect before every freeze still frees every cycle, so
    memory stays bounded as before.
    """
    _collect_and_freeze()
    threshold_0, threshold_1, _ = gc.get_threshold()
    gc.set_threshold(threshold_0, threshold_1, _FULL_COLLECTION_THRESHOLD)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Every ``_TESTS_BETWEEN_FREEZES`` tests: collects, then freezes what is
    still alive, so that later full collections leave it out.

    Python's full (generation-2) collections scan every object the process
    holds. With TensorFlow, Keras and the graphs earlier tests traced, that is
    about 1.8 million objects by the end of a worker's share of the suite, and
    the tests that trace many functions set off such a collection every few
    seconds: measured on the 2-core machine (2026-12-05), one worker spent
    124 s of the README command's run in them (76 s in
    ``test_quantized_reversible.py`` alone, about 1 s each). Frozen objects are
    never scanned (nor collected: what a test leaves alive in a cycle past a
    freeze stays until the worker ends). With freezes every 40 tests the
    workers spent 7 s and 3.5 s, and the suite's CPU time fell by a fifth;
    every 10 tests, see ``pytest_collection_finish``. No test runs
    differently: only when the collector looks, and at what.
    """
    global _tests_since_freeze
    _tests_since_freeze += 1
    if _tests_since_freeze >= _TESTS_BETWEEN_FREEZES:
        _tests_since_freeze = 0
        _collect_and_freeze()
