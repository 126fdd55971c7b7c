"""What the tests share: dtype lists, bit-for-bit comparison, seeded randomness.

Seeds. Every random draw in the tests comes from :func:`make_rng`, which mixes
one base seed with the name of the case. The base seed is fixed (0) unless the
environment variable ``PE_TEST_SEED`` says otherwise: an integer replays a
run, ``random`` draws a fresh one. The seed in use is printed, so pytest shows
it beside any failure; rerun with ``PE_TEST_SEED=<that value>`` to reproduce.
"""

from __future__ import annotations

import os
import secrets
import zlib
from typing import Any

import numpy as np
import tensorflow as tf

#: The table dtypes every kernel implements.
VALUE_DTYPES: tuple[tf.DType, ...] = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
#: The same, by name (for the TF-free kernel module and NumPy-side code).
VALUE_DTYPE_NAMES: tuple[str, ...] = tuple(dtype.name for dtype in VALUE_DTYPES)
#: The index dtypes every op accepts.
INDEX_DTYPES: tuple[tf.DType, ...] = (tf.int32, tf.int64)

_UNSIGNED_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SEED_ENVIRONMENT = "PE_TEST_SEED"
_random_base: int | None = None


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


def case_seed(*parts: object) -> int:
    """The seed of one case: the base seed mixed with the case's name."""
    return (base_seed() ^ zlib.crc32(repr(parts).encode())) % (2**63)


def make_rng(*parts: object) -> np.random.Generator:
    """A generator for the case named by ``parts``; prints how to replay it."""
    seed = case_seed(*parts)
    print(f"{_SEED_ENVIRONMENT}={base_seed()} (case seed {seed} for {parts!r})")
    return np.random.default_rng(seed)


def as_numpy(value: Any) -> np.ndarray:
    """A NumPy array of a tensor, variable (TF or Keras) or array-like."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value.numpy()
    inner = getattr(value, "value", None)
    if isinstance(inner, (tf.Tensor, tf.Variable)):
        return inner.numpy()
    return np.asarray(value)


def bits(value: Any) -> np.ndarray:
    """The raw bit patterns, so equal means bit-identical (NaN and -0 included)."""
    array = np.ascontiguousarray(as_numpy(value))
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
