"""``_internal.variables.gather_rows``: rows of a variable without copy-on-read
mode; one-byte rows (the int8 frozen table) moved as wider floats of the same
bits, since TensorFlow's GPU ``GatherV2`` has no int8 kernel and would run on
the host, copying the whole table there at every read."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding._internal.variables import _byte_row_carrier, gather_rows
from pe_testing import buffer_address


def _every_byte(rng: np.random.Generator, rows: int, row_shape: tuple, dtype: type) -> np.ndarray:
    """A table holding every byte value, the rest random."""
    size = rows * int(np.prod(row_shape))
    values = np.concatenate([np.arange(256), rng.integers(0, 256, size=max(0, size - 256))])
    return values[:size].astype(np.uint8).view(dtype).reshape((rows, *row_shape))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("row_shape", [(1,), (2,), (3,), (4,), (6,), (8,), (2, 3), (128,)])
@pytest.mark.parametrize("mode", ["eager", "tf_function", "xla"])
def test_byte_rows_are_gathered_bit_for_bit(
    rng: np.random.Generator, dtype: type, row_shape: tuple, mode: str
) -> None:
    table = _every_byte(rng, 300, row_shape, dtype)
    variable = tf.Variable(table)
    ids = rng.integers(0, 300, size=(4, 7)).astype(np.int32)

    def gather(ids: tf.Tensor) -> tf.Tensor:
        return gather_rows(variable, ids)

    if mode != "eager":
        gather = tf.function(gather, jit_compile=mode == "xla")
    result = gather(tf.constant(ids)).numpy()
    assert result.dtype == table.dtype and result.shape == (4, 7, *row_shape)
    np.testing.assert_array_equal(result, table[ids])


@pytest.mark.parametrize(
    ("row_shape", "carrier"),
    [((4,), tf.float32), ((128,), tf.float32), ((2, 2), tf.float32), ((6,), tf.float16),
     ((2,), tf.float16), ((3,), None), ((1,), None)],
)  # fmt: skip
def test_the_carrier_is_the_widest_float_that_splits_a_row(row_shape, carrier) -> None:
    value = tf.zeros((5, *row_shape), tf.int8)
    found = _byte_row_carrier(value)
    assert (found[0] if found else None) == carrier
    assert _byte_row_carrier(tf.zeros((5, *row_shape), tf.float32)) is None


@pytest.mark.usefixtures("on_cpu")  # buffer addresses through DLPack: host buffers
def test_gathering_byte_rows_keeps_the_variable_out_of_copy_on_read_mode(rng) -> None:
    """After the gather, full reads still alias the buffer (a variable in
    copy-on-read mode would hand every read a fresh copy)."""
    variable = tf.Variable(_every_byte(rng, 64, (8,), np.int8))
    gather_rows(variable, [3, 1])
    tf.function(lambda: gather_rows(variable, tf.constant([2])))()
    assert buffer_address(variable) == buffer_address(variable)


@pytest.mark.gpu
@pytest.mark.parametrize("row_shape", [(8,), (3,)])
def test_byte_rows_on_a_gpu(rng: np.random.Generator, row_shape: tuple) -> None:
    table = _every_byte(rng, 300, row_shape, np.int8)
    with tf.device("/GPU:0"):
        variable = tf.Variable(table)
    ids = rng.integers(0, 300, size=50)
    np.testing.assert_array_equal(gather_rows(variable, ids).numpy(), table[ids])
