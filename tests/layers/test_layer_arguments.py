"""Constructor arguments that must be refused at once (issue #24, item 5).

Each bad argument raises a ``ValueError`` (``PartialEmbeddingArgumentError``
or its ``TypeError`` kin) naming the argument and the value, from
``__init__``, before anything the size of the table or of its mask exists;
``from_config`` raises it as a ``TypeError`` too, as Keras' ``from_config``
does; and the package keeps the module and registered names saved files use.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import layers as pe_layers
from partial_embedding.layers import _arguments

LAYERS = [pe.PartialEmbedding, pe.PartialReversibleEmbedding]


@pytest.fixture
def no_allocation(monkeypatch):
    """Fails the test if numpy allocates a [V] mask or a table is created."""

    def refuse(*args, **kwargs):
        raise AssertionError("allocated before the arguments were checked")

    monkeypatch.setattr(keras.layers.Layer, "add_weight", refuse)
    monkeypatch.setattr(np, "ones", refuse)
    monkeypatch.setattr(np, "zeros", refuse)


# -- dimensions ------------------------------------------------------------------


@pytest.mark.parametrize("layer_class", LAYERS)
@pytest.mark.parametrize("argument", ["input_dim", "output_dim"])
@pytest.mark.parametrize(
    "value", [0, -3, 2.0, 4.5, True, np.bool_(True), "4", None, 2**31, 2**33, 2**64]
)
def test_bad_dimension_is_refused_naming_it(layer_class, argument, value, no_allocation):
    dims = {"input_dim": 4, "output_dim": 2}
    dims[argument] = value
    with pytest.raises(ValueError, match=rf"`{argument}`.*{argument}="):
        layer_class(dims["input_dim"], dims["output_dim"])


@pytest.mark.parametrize("layer_class", LAYERS)
@pytest.mark.parametrize("argument", ["input_dim", "output_dim"])
@pytest.mark.parametrize("value", [3.7, 0, "3"])
def test_bad_dimension_in_a_config_is_a_type_error_as_in_keras(layer_class, argument, value):
    # Keras' Layer.from_config raises a TypeError for any bad argument, and
    # Keras' own embedding tests expect one; ours still names the argument
    # and its value, and is still the ValueError the constructor raises.
    config = {**layer_class(4, 2).get_config(), argument: value}
    with pytest.raises(
        TypeError,
        match=rf"^{layer_class.__name__}\.from_config: `{argument}` must be a positive "
        rf"integer.*Received: {argument}={value!r}",
    ) as error:
        layer_class.from_config(config)
    assert isinstance(error.value, pe.PartialEmbeddingTypeError)
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("value", [2**31, 2**33])
def test_dimension_past_int32_names_the_limit(value, no_allocation):
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=rf"2\*\*31 - 1.*input_dim={value}"):
        pe.PartialEmbedding(value, 8)


def test_largest_dimension_constructs_without_a_mask(no_allocation):
    # The [V] mask waits for build: constructing a layer of 2**31 - 1 rows
    # allocates nothing (np.ones and add_weight refuse here).
    layer = pe.PartialEmbedding(_arguments.MAX_DIMENSION, 8)
    assert layer.input_dim == 2**31 - 1
    assert not layer.built


@pytest.mark.parametrize("integer", [np.int64(5), np.int32(5), np.uint16(5)])
def test_numpy_integers_are_dimensions(integer):
    layer = pe.PartialEmbedding(integer, integer)
    assert (type(layer.input_dim), layer.input_dim, layer.output_dim) == (int, 5, 5)
    assert layer.get_config()["input_dim"] == 5


def test_len_vocab_and_output_dim_of_partial_embeddings_update(no_allocation):
    with pytest.raises(ValueError, match=r"`len_vocab`.*len_vocab=2.5"):
        pe.PartialEmbeddingsUpdate(2.5, None, None, output_dim=2)
    with pytest.raises(ValueError, match=r"`output_dim`.*output_dim=-1"):
        pe.PartialEmbeddingsUpdate(3, None, None, output_dim=-1)


def test_untouched_mask_reads_every_row_before_and_after_build():
    layer = pe.PartialEmbedding(5, 2)
    np.testing.assert_array_equal(layer.trainable_ids, np.arange(5))
    layer.freeze([1])
    layer.build()
    np.testing.assert_array_equal(layer.trainable_mask.numpy(), [1, 0, 1, 1, 1])
    untied = pe.PartialReversibleEmbedding(5, 2, tie_weights=False, frozen_ids=[0])
    np.testing.assert_array_equal(untied.reverse_trainable_ids, [1, 2, 3, 4])
    untied.build()
    np.testing.assert_array_equal(untied.reverse_trainable_mask.numpy(), [0, 1, 1, 1, 1])
    everything = pe.PartialReversibleEmbedding(3, 2, tie_weights=False)
    everything.build()
    assert everything.reverse_trainable_mask.numpy().all()


# -- reverse_dtype ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["int32", "int16", "bool", "string", tf.int32, np.int64])
def test_reverse_dtype_that_is_not_a_float_dtype_is_refused(value, no_allocation):
    with pytest.raises(
        pe.PartialEmbeddingTypeError, match=r"reverse_dtype.*Received: reverse_dtype="
    ):
        pe.PartialReversibleEmbedding(4, 2, reverse_dtype=value)


@pytest.mark.parametrize("value", [5, 1, True, 2.5, "nope"])
def test_reverse_dtype_that_names_no_dtype_is_a_value_error_as_in_keras(value, no_allocation):
    # Keras: ValueError("Invalid dtype: 5"); ours names the argument too.
    with pytest.raises(
        ValueError, match=rf"reverse_dtype.*Received: reverse_dtype={value!r}\."
    ) as error:
        pe.PartialReversibleEmbedding(4, 2, reverse_dtype=value)
    assert not isinstance(error.value, TypeError)
    # from_config: a TypeError, as Keras' from_config raises for any bad argument.
    config = {**pe.PartialReversibleEmbedding(4, 2).get_config(), "reverse_dtype": value}
    with pytest.raises(pe.PartialEmbeddingTypeError, match="from_config: reverse_dtype"):
        pe.PartialReversibleEmbedding.from_config(config)


@pytest.mark.parametrize("layer_class", LAYERS)
@pytest.mark.parametrize("argument", ["trainable_ids", "frozen_ids"])
def test_ragged_ids_in_a_config_are_refused_naming_them(layer_class, argument):
    config = {**layer_class(4, 2).get_config(), argument: [[1, 2], [3]]}
    with pytest.raises(
        pe.PartialEmbeddingArgumentError,
        match=rf"{argument}: .*ragged.*{argument}=\[\[1, 2\], \[3\]\]",
    ):
        layer_class.from_config(config)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=rf"{argument}: .*ragged"):
        layer_class(4, 2, **{argument: [[1, 2], [3]]})


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("compute_dtype", "compute_dtype"),
        ("float16", "float16"),
        ("bfloat16", "bfloat16"),
        (tf.float64, "float64"),
        (np.float32, "float32"),
    ],
)
def test_reverse_dtype_names_a_float_dtype(value, expected):
    layer = pe.PartialReversibleEmbedding(4, 2, reverse_dtype=value)
    assert layer.reverse_dtype == expected
    assert layer.get_config()["reverse_dtype"] == expected


# -- row ids -----------------------------------------------------------------------


@pytest.mark.parametrize("layer_class", LAYERS)
@pytest.mark.parametrize("argument", ["trainable_ids", "frozen_ids"])
@pytest.mark.parametrize("ids", [[1, np.nan], [0.0, 2.0], np.array([1.5]), ["a"]])
def test_row_ids_that_are_not_integers_are_refused(layer_class, argument, ids):
    with pytest.raises(
        pe.PartialEmbeddingTypeError, match=rf"{argument}: row ids must be integers"
    ):
        layer_class(4, 2, **{argument: ids})


def test_reverse_trainable_ids_are_checked_before_anything_is_built(no_allocation):
    with pytest.raises(ValueError, match="reverse_trainable_ids needs tie_weights=False"):
        pe.PartialReversibleEmbedding(4, 2, reverse_trainable_ids=[1])


def test_reverse_trainable_ids_out_of_range():
    with pytest.raises(ValueError, match=r"reverse_trainable_ids: id 4 .* not in \[0, 4\)"):
        pe.PartialReversibleEmbedding(4, 2, tie_weights=False, reverse_trainable_ids=[4])


# -- weights -----------------------------------------------------------------------

BAD_TABLES = {
    "wrong shape": (np.zeros([3, 2], np.float32), pe.PartialEmbeddingArgumentError, "shape"),
    "strings": (np.full([4, 2], "x"), pe.PartialEmbeddingTypeError, "dtype <U1"),
    "objects": (np.empty([4, 2], dtype=object), pe.PartialEmbeddingTypeError, "dtype object"),
    "bools": (np.ones([4, 2], dtype=bool), pe.PartialEmbeddingTypeError, "dtype bool"),
    "complex": (np.ones([4, 2], dtype=np.complex64), pe.PartialEmbeddingTypeError, "complex64"),
    "ragged list": ([[1.0, 2.0], [3.0], [4.0, 5.0], [6.0, 7.0]], ValueError, "rectangular"),
    "ragged tensor": (
        tf.ragged.constant([[1.0, 2.0], [3.0], [4.0, 5.0], [6.0, 7.0]]),
        ValueError,
        "rectangular.*RaggedTensor",
    ),
    "string tensor": (tf.fill([4, 2], "x"), pe.PartialEmbeddingTypeError, "dtype"),
}


@pytest.mark.parametrize("layer_class", LAYERS)
@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_weights_are_refused_and_nothing_is_built(layer_class, case, monkeypatch):
    table, error, message = BAD_TABLES[case]
    built = []
    monkeypatch.setattr(
        keras.layers.Layer, "add_weight", lambda *args, **kwargs: built.append(args)
    )
    with pytest.raises(error, match=rf"weights.*{message}"):
        layer_class(4, 2, weights=table)
    assert built == []


def test_bad_table_next_to_a_mask_is_named_as_weights_0():
    with pytest.raises(pe.PartialEmbeddingTypeError, match=r"weights\[0\]: .*dtype <U1"):
        pe.PartialEmbedding(4, 2, weights=[np.full([4, 2], "x"), np.ones([4], bool)])


def test_partial_embeddings_update_refuses_a_ragged_matrix(no_allocation):
    with pytest.raises(ValueError, match="weights: the table must be a rectangular"):
        pe.PartialEmbeddingsUpdate(3, [[1.0, 2.0], [3.0], [4.0, 5.0]], None)


def test_integer_weights_are_cast_to_the_table_dtype():
    layer = pe.PartialEmbedding(4, 2, weights=np.arange(8).reshape(4, 2))
    np.testing.assert_array_equal(layer.embeddings.numpy(), np.arange(8).reshape(4, 2))
    assert layer.embeddings.dtype == "float32"


def test_two_row_pretrained_list_is_a_table_not_a_table_and_mask():
    layer = pe.PartialEmbeddingsUpdate(2, [[1.0, 2.0], [3.0, 4.0]], [1])
    np.testing.assert_array_equal(layer.embeddings.numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(layer.trainable_ids, [1])


# -- names saved files use ------------------------------------------------------------


@pytest.mark.parametrize(
    "layer_class", [pe.PartialEmbedding, pe.PartialEmbeddingsUpdate, pe.PartialReversibleEmbedding]
)
def test_module_and_registered_name_are_those_saved_files_hold(layer_class):
    name = layer_class.__name__
    assert layer_class.__module__ == "partial_embedding.layers"
    assert getattr(pe_layers, name) is layer_class
    assert keras.saving.get_registered_name(layer_class) == f"partial_embedding>{name}"
    assert keras.saving.get_registered_object(f"partial_embedding>{name}") is layer_class
    layer = (
        pe.PartialEmbeddingsUpdate(3, None, None, output_dim=2)
        if (layer_class is pe.PartialEmbeddingsUpdate)
        else layer_class(3, 2)
    )
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["module"] == "partial_embedding.layers"
    assert serialized["registered_name"] == f"partial_embedding>{name}"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is layer_class


def test_bfloat16_weights_are_a_float_table():
    import ml_dtypes

    table = np.arange(8, dtype=np.float32).reshape(4, 2).astype(ml_dtypes.bfloat16)
    layer = pe.PartialEmbedding(4, 2, weights=table, dtype="bfloat16")
    restored = layer.embeddings.numpy().astype(np.float32)
    np.testing.assert_array_equal(restored, np.arange(8).reshape(4, 2))
