"""Every variable the library makes next to a table can live where the table lives.

TensorFlow keeps ``int32`` tensors in host memory on a GPU: an ``int32``
variable made under ``tf.device(<GPU variable>.device)`` lands on ``CPU:0``,
and an XLA step on the GPU then stops with "Trying to access resource ...
located in device CPU:0 from device GPU:0". On CPUs alone every variable is
on a CPU, so placement cannot show the bug there; these tests guard it by
construction instead: no variable made while a model is built and trained
(the layer's, the optimizer's, and the bookkeeping the library makes beside
a table: XLA owner maps, compact-slot counters, the int8 store's maps) has a
dtype TensorFlow keeps on the host. The ``gpu`` tests check the placement
itself on a GPU.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.bench import _gpu_step as gpu_step
from partial_embedding.bench._gpu_step import (
    HOST_MEMORY_DTYPES,
    fit_check,
    tied_lm_check,
    variables_made_by,
)
from partial_embedding.ops import xla_custom_call


def _host_dtype_variables(made: list[tf.Variable]) -> list[str]:
    return sorted({f"{v.name}: {v.dtype.name}" for v in made if v.dtype in HOST_MEMORY_DTYPES})


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_fit_makes_no_host_memory_variable(
    rng: np.random.Generator, quantized: bool, jit_compile: bool
) -> None:
    result = fit_check(jit_compile, quantized, rng, "/CPU:0")
    assert result["host_dtype"] == [], result
    assert result["frozen_bit_for_bit"] and result["permitted_moved"], result
    assert result["variables"] > 10  # the layer's, the optimizer's and ours were all seen


def test_tied_lm_under_xla_makes_no_host_memory_variable(rng: np.random.Generator) -> None:
    result = tied_lm_check(rng, "/CPU:0")
    assert result["host_dtype"] == [], result
    assert result["frozen_bit_for_bit"] and result["permitted_moved"], result


@pytest.mark.parametrize("compact_slots", [True, False])
@pytest.mark.parametrize("rule", ["adam", "adamw", "momentum", "adagrad", "rmsprop"])
def test_every_rule_under_xla_makes_no_host_memory_variable(
    rng: np.random.Generator, rule: str, compact_slots: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every rule takes the CPU's XLA custom call; two of them are sent down
    # the stock-op XLA path instead, which a GPU takes, so it is checked too.
    stock = rule in ("momentum", "rmsprop")
    if stock:
        monkeypatch.setattr(xla_custom_call, "custom_calls_apply", lambda variable: False)
    inner = {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "adamw": lambda: keras.optimizers.AdamW(0.01),
        "momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        "adagrad": lambda: keras.optimizers.Adagrad(0.01),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    }[rule]()
    vocab, width = 200, 4
    trainable = rng.choice(vocab, size=10, replace=False)
    ids = rng.integers(0, vocab, size=(32, 5)).astype(np.int32)
    ids[:, 0] = rng.choice(trainable, size=32)
    with variables_made_by() as made:
        layer = pe.PartialEmbedding(vocab, width, trainable_ids=trainable)
        model = keras.Sequential(
            [keras.Input((5,), dtype="int32"), layer, keras.layers.Flatten(), keras.layers.Dense(1)]
        )
        model.compile(
            optimizer=pe.MaskedOptimizer(inner, compact_slots=compact_slots),
            loss="mse",
            jit_compile=True,
        )
        model.fit(ids, np.ones((32, 1), np.float32), batch_size=16, epochs=1, verbose=0)
    assert _host_dtype_variables(made) == []
    names = " ".join(v.name for v in made)
    # The stock XLA path's scratch was made (and checked) only where it ran.
    assert ("xla_owner_map" in names) == stock


def test_the_guard_sees_an_int32_variable() -> None:
    """The guard itself: an int32 variable made inside is reported."""
    with variables_made_by() as made:
        tf.Variable(tf.zeros([3], tf.int32), name="counter")
        tf.Variable(tf.zeros([3], tf.int64), name="fine")
    assert _host_dtype_variables(made) == ["counter:0: int32"]


def test_the_smoke_check_says_so_without_a_gpu(capsys) -> None:
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here")
    with pytest.raises(SystemExit) as exited:
        gpu_step.main(["--no-timing"])
    assert exited.value.code == 2
    assert "sees no GPU" in capsys.readouterr().out


# -- on a GPU ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("jit_compile", ["auto", False, True])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_fit_on_a_gpu_keeps_every_variable_there(
    rng: np.random.Generator, quantized: bool, jit_compile: object
) -> None:
    result = fit_check(jit_compile, quantized, rng, "/GPU:0")
    assert result["off_device"] == [] and result["host_dtype"] == [], result
    assert result["passed"], result


@pytest.mark.gpu
def test_tied_lm_step_under_xla_on_a_gpu(rng: np.random.Generator) -> None:
    result = tied_lm_check(rng, "/GPU:0")
    assert result["off_device"] == [] and result["host_dtype"] == [], result
    assert result["passed"], result
