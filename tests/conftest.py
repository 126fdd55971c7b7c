"""Shared test setup: quiet TensorFlow's C++ logging before it is imported, and
the seeded ``rng`` fixture (see ``pe_testing`` for how seeds are chosen)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pe_testing import make_rng  # noqa: E402


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from ``PE_TEST_SEED`` (default 0) and the test's id."""
    return make_rng(request.node.nodeid)
