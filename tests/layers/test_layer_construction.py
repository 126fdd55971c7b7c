"""Building a PartialEmbedding without table-sized transients (issue #13, item 2).

A table of at least ``BLOCKED_INIT_MIN_BYTES`` is allocated once and filled by
its initializer in row blocks; ``weights=`` (a NumPy array or a memory-mapped
``.npy``) and ``set_weights`` copy in row blocks at any size. The value tests
lower both thresholds so that small tables take the blocked path; the memory
tests build a 128 MiB table in a fresh process (this file run as a script) and
sample its anonymous memory (``RssAnon``) every millisecond.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.layers import _table_init
from pe_testing import assert_bits_equal, bits_equal, once_per_run, seed_environment

ROWS, WIDTH = 4096, 16
BLOCK_ROWS = 64  # rows per block in the value tests (BLOCK_BYTES lowered to match)
MEMORY_ROWS, MEMORY_WIDTH = 262144, 128  # 128 MiB of float32
TIMEOUT_S = 240


@pytest.fixture
def blocked(monkeypatch):
    """Every table takes the blocked path, in blocks of BLOCK_ROWS float32 rows."""
    monkeypatch.setattr(_table_init, "BLOCKED_INIT_MIN_BYTES", 0)
    monkeypatch.setattr(_table_init, "BLOCK_BYTES", BLOCK_ROWS * WIDTH * 4)


def _table(layer: pe.PartialEmbedding) -> np.ndarray:
    layer.build()
    return layer.embeddings.numpy()


def _stock_table(initializer, seed: int, **kwargs) -> np.ndarray:
    keras.utils.set_random_seed(seed)
    stock = keras.layers.Embedding(ROWS, WIDTH, embeddings_initializer=initializer, **kwargs)
    stock.build()
    return stock.embeddings.numpy()


def _our_table(initializer, seed: int, **kwargs) -> np.ndarray:
    keras.utils.set_random_seed(seed)
    return _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=initializer, **kwargs))


# -- small tables: exactly what add_weight gives -------------------------------------


@pytest.mark.parametrize(
    "initializer", ["uniform", "glorot_uniform", "truncated_normal", "orthogonal", "ones"]
)
@pytest.mark.parametrize("dtype", ["float32", "float64", "mixed_float16"])
def test_small_table_equals_the_stock_embedding_under_the_same_seed(initializer, dtype):
    table_bytes = ROWS * WIDTH * 8
    assert table_bytes < _table_init.BLOCKED_INIT_MIN_BYTES
    expected = _stock_table(initializer, 11, dtype=dtype)
    actual = _our_table(initializer, 11, dtype=dtype)
    assert actual.dtype == expected.dtype
    assert_bits_equal(actual, expected, f"{initializer} table")


# -- large tables: per-block initializers ---------------------------------------------

SEEDED = {
    "uniform": lambda seed: keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
    "normal": lambda seed: keras.initializers.RandomNormal(0.3, 2.0, seed=seed),
    "truncated_normal": lambda seed: keras.initializers.TruncatedNormal(stddev=1.0, seed=seed),
    "glorot_uniform": lambda seed: keras.initializers.GlorotUniform(seed=seed),
    "glorot_normal": lambda seed: keras.initializers.GlorotNormal(seed=seed),
    "he_normal": lambda seed: keras.initializers.HeNormal(seed=seed),
    "he_uniform": lambda seed: keras.initializers.HeUniform(seed=seed),
    "lecun_normal": lambda seed: keras.initializers.LecunNormal(seed=seed),
    "lecun_uniform": lambda seed: keras.initializers.LecunUniform(seed=seed),
    "fan_out_untruncated": lambda seed: keras.initializers.VarianceScaling(
        3.0, "fan_out", "untruncated_normal", seed=seed
    ),
    "fan_avg_uniform": lambda seed: keras.initializers.VarianceScaling(
        0.5, "fan_avg", "uniform", seed=seed
    ),
}
UNBOUNDED = ("normal", "fan_out_untruncated")


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_blocked_random_initializer_matches_the_distribution(blocked, name):
    make = SEEDED[name]
    table = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=make(5)))
    # One unblocked call of the same initializer: the distribution to match,
    # its fans computed from the whole table.
    reference = keras.ops.convert_to_numpy(make(5)((ROWS, WIDTH), dtype="float32"))
    assert table.shape == (ROWS, WIDTH) and table.dtype == np.float32
    assert not bits_equal(table, reference)  # blocked: not the numbers of one call
    spread = reference.std()
    if name not in UNBOUNDED:
        # Uniform and truncated: the samples of one call nearly reach the bound.
        bound = np.abs(reference).max()
        assert np.abs(table).max() <= bound * 1.001
    standard_error = spread / np.sqrt(table.size)
    assert abs(table.mean() - reference.mean()) < 6 * standard_error
    assert table.std() == pytest.approx(spread, rel=0.02)
    # Each block alone follows it too (no block drawn from another scale).
    for start in range(0, ROWS, BLOCK_ROWS * 16):
        block = table[start : start + BLOCK_ROWS]
        assert block.std() == pytest.approx(spread, rel=0.15)


@pytest.mark.parametrize("name", ["uniform", "glorot_uniform", "truncated_normal"])
def test_blocked_random_initializer_same_numbers_on_every_build(blocked, name):
    make = SEEDED[name]
    first = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=make(9)))
    second = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=make(9)))
    assert_bits_equal(second, first, "a second build with the same seed")
    shared = make(9)
    third = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=shared))
    fourth = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=shared))
    assert_bits_equal(third, first, "the same seed, another initializer object")
    assert_bits_equal(fourth, first, "the same initializer object built twice")
    other = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=make(10)))
    assert not np.any(np.all(other == first, axis=1))


def test_blocked_default_initializer_follows_the_global_seed(blocked):
    first = _our_table("uniform", 3)
    again = _our_table("uniform", 3)
    other = _our_table("uniform", 4)
    assert_bits_equal(again, first, "the same global seed")
    assert not np.any(np.all(other == first, axis=1))
    assert -0.05 <= first.min() and first.max() < 0.05


def test_blocked_seed_generator_takes_one_draw_per_build(blocked):
    def build(generator):
        initializer = keras.initializers.RandomNormal(seed=generator)
        return _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=initializer))

    generator = keras.random.SeedGenerator(21)
    first, second = build(generator), build(generator)
    assert not np.any(np.all(first == second, axis=1))
    replay = keras.random.SeedGenerator(21)
    assert_bits_equal(build(replay), first, "a generator with the same seed")
    assert_bits_equal(build(replay), second, "its second draw")


@pytest.mark.parametrize("name", ["uniform", "normal", "he_normal"])
def test_block_boundaries_are_invisible(blocked, name):
    table = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=SEEDED[name](2)))
    blocks = table.reshape(ROWS // BLOCK_ROWS, BLOCK_ROWS * WIDTH)
    # No block repeats another, in whole or in its first row.
    assert len({block.tobytes() for block in blocks}) == len(blocks)
    assert len({block[:WIDTH].tobytes() for block in blocks}) == len(blocks)
    assert len(np.unique(table)) > 0.99 * table.size


@pytest.mark.parametrize(
    "initializer, value",
    [("zeros", 0.0), ("ones", 1.0), (keras.initializers.Constant(0.375), 0.375)],
    ids=["zeros", "ones", "constant"],
)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_blocked_constant_initializers_give_exact_values(blocked, initializer, value, dtype):
    layer = pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=initializer, dtype=dtype)
    table = _table(layer)
    assert layer.embeddings.dtype == dtype
    assert_bits_equal(table, np.full([ROWS, WIDTH], value, dtype=table.dtype), "constant table")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "mixed_float16"])
def test_blocked_random_initializer_in_every_dtype(blocked, dtype):
    layer = pe.PartialEmbedding(ROWS, WIDTH, dtype=dtype)
    table = np.asarray(_table(layer), dtype=np.float64)
    assert layer.embeddings.dtype == ("float32" if dtype == "mixed_float16" else dtype)
    # The bound as the dtype rounds it (bfloat16: 0.050048828125).
    bound = float(tf.cast(0.05, layer.embeddings.dtype))
    assert -bound <= table.min() and table.max() <= bound
    assert table.std() == pytest.approx(0.1 / np.sqrt(12), rel=0.03)


@pytest.mark.parametrize("initializer", ["orthogonal", "identity"])
def test_initializers_that_cannot_be_blocked_give_the_stock_values(blocked, initializer):
    expected = _stock_table(initializer, 13)
    assert_bits_equal(_our_table(initializer, 13), expected, f"{initializer} table")


def test_custom_callable_initializer_gives_its_values(blocked):
    def initializer(shape, dtype=None):
        return tf.reshape(tf.range(shape[0] * shape[1], dtype=dtype), shape)

    table = _table(pe.PartialEmbedding(ROWS, WIDTH, embeddings_initializer=initializer))
    np.testing.assert_array_equal(table.reshape(-1), np.arange(ROWS * WIDTH))


def test_blocked_table_is_the_same_keras_variable(blocked):
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, name="vocabulary", trainable_ids=[1, 5], embeddings_constraint="non_neg"
    )
    layer.build()
    stock = keras.layers.Embedding(ROWS, WIDTH, name="vocabulary")
    stock.build()
    assert isinstance(layer.embeddings, keras.Variable)
    assert layer.embeddings.path == stock.embeddings.path == "vocabulary/embeddings"
    assert layer.embeddings.name == stock.embeddings.name
    assert layer.embeddings.trainable and not layer.trainable_mask.trainable
    assert [v.path for v in layer.weights] == ["vocabulary/embeddings", "vocabulary/trainable_mask"]
    assert layer.embeddings._partial_embedding_row_mask is layer.trainable_mask
    np.testing.assert_array_equal(layer.trainable_ids, [1, 5])
    before = layer.embeddings.numpy().copy()
    model = keras.Sequential([keras.Input((3,), dtype="int32"), layer])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    ids = np.array([[1, 2, 5]], np.int32)
    model.fit(ids, np.ones([1, 3, WIDTH]), verbose=0)
    after = layer.embeddings.numpy()
    changed = np.flatnonzero(np.any(after != before, axis=1))
    np.testing.assert_array_equal(changed, [1, 5])


def test_under_a_distribution_strategy_the_plain_path_builds_a_mirrored_table(blocked):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    expected = _stock_table("uniform", 17)
    table = np.arange(ROWS * WIDTH, dtype=np.float64).reshape(ROWS, WIDTH)
    with strategy.scope():
        keras.utils.set_random_seed(17)
        layer = pe.PartialEmbedding(ROWS, WIDTH)
        layer.build()
        loaded = pe.PartialEmbedding(ROWS, WIDTH, weights=table)
    for built, values in ((layer, expected), (loaded, table.astype(np.float32))):
        assert isinstance(built.embeddings.value, tf.distribute.DistributedValues)
        assert_bits_equal(built.embeddings.numpy(), values, "table under the strategy")


# -- weights= and set_weights in row blocks ----------------------------------------------


@pytest.mark.parametrize("source", ["array", "float64", "memmap", "list_with_mask"])
def test_weights_are_copied_in_row_blocks(blocked, rng, tmp_path, source):
    table = rng.standard_normal([ROWS, WIDTH]).astype(np.float32)
    mask = rng.random(ROWS) < 0.25
    weights = table
    if source == "float64":
        weights = table.astype(np.float64)
    elif source == "memmap":
        np.save(tmp_path / "table.npy", table)
        weights = np.load(tmp_path / "table.npy", mmap_mode="r")
    elif source == "list_with_mask":
        weights = [table, mask]
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=weights)
    assert_bits_equal(layer.embeddings.numpy(), table, f"table from {source}")
    expected_mask = mask if source == "list_with_mask" else np.ones(ROWS, bool)
    np.testing.assert_array_equal(layer.trainable_mask.numpy(), expected_mask)
    pretrained = table if source == "list_with_mask" else weights
    update = pe.PartialEmbeddingsUpdate(ROWS, pretrained, mask)
    assert_bits_equal(update.embeddings.numpy(), table, f"PartialEmbeddingsUpdate from {source}")
    np.testing.assert_array_equal(update.trainable_mask.numpy(), mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_weights_are_cast_per_block_as_keras_casts(blocked, rng, dtype):
    table = rng.standard_normal([ROWS, WIDTH])
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=table, dtype=dtype)
    stock = keras.layers.Embedding(ROWS, WIDTH, dtype=dtype)
    stock.build()
    stock.embeddings.assign(table)
    assert_bits_equal(layer.embeddings.numpy(), stock.embeddings.numpy(), f"{dtype} table")


def test_weights_of_the_wrong_shape_are_refused_before_any_memory(tmp_path):
    np.save(tmp_path / "table.npy", np.zeros([ROWS + 1, WIDTH], np.float32))
    mapped = np.load(tmp_path / "table.npy", mmap_mode="r")
    with pytest.raises(ValueError, match=r"the table must have shape \(4096, 16\).*\(4097, 16\)"):
        pe.PartialEmbedding(ROWS, WIDTH, weights=mapped)


def test_set_weights_copies_in_row_blocks(blocked, rng):
    table = rng.standard_normal([ROWS, WIDTH]).astype(np.float32)
    mask = rng.random(ROWS) < 0.5
    layer = pe.PartialEmbedding(ROWS, WIDTH, frozen_ids=[0])
    layer.build()
    layer.set_weights([table])
    assert_bits_equal(layer.embeddings.numpy(), table, "set_weights([table])")
    assert not layer.trainable_mask.numpy()[0] and layer.trainable_mask.numpy()[1:].all()
    layer.set_weights([table * 2, mask])
    assert_bits_equal(layer.embeddings.numpy(), table * 2, "set_weights([table, mask])")
    np.testing.assert_array_equal(layer.trainable_mask.numpy(), mask)
    with pytest.raises(ValueError, match="not compatible"):
        layer.set_weights([table[:-1], mask])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_saved_table_and_mask_load_in_row_blocks(blocked, rng, tmp_path, monkeypatch, dtype):
    table = rng.standard_normal([ROWS, WIDTH]).astype(np.float32)
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=table, trainable_ids=[3, 8], dtype=dtype)
    model = keras.Sequential([keras.Input((2,), dtype="int32"), layer])
    path = str(tmp_path / "table.weights.h5")
    model.save_weights(path)
    fresh = pe.PartialEmbedding(ROWS, WIDTH, dtype=dtype)
    restored = keras.Sequential([keras.Input((2,), dtype="int32"), fresh])
    writes = []
    write_rows = _table_init.write_rows

    def counting_write_rows(*args):
        writes.append(args[1:3])
        write_rows(*args)

    monkeypatch.setattr(_table_init, "write_rows", counting_write_rows)
    restored.load_weights(path)
    # BLOCK_BYTES holds BLOCK_ROWS float32 rows, twice as many bfloat16 ones.
    assert len(writes) == ROWS // BLOCK_ROWS // (2 if dtype == "bfloat16" else 1)
    assert_bits_equal(fresh.embeddings.numpy(), layer.embeddings.numpy(), "loaded table")
    np.testing.assert_array_equal(fresh.trainable_ids, [3, 8])


# -- memory: RssAnon sampled in a fresh process ------------------------------------------


def _rss_anon() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _peak_growth(build) -> float:
    """Peak RssAnon over the baseline while ``build()`` runs, in bytes."""
    baseline = _rss_anon()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        build()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], _rss_anon()) - baseline


def _measure(case: str, directory: str) -> dict:
    # Warm the ops the build uses on a tiny blocked table, so that one-time
    # costs (thread pools, kernels) stay out of the measurement.
    saved = _table_init.BLOCKED_INIT_MIN_BYTES
    _table_init.BLOCKED_INIT_MIN_BYTES = 0
    pe.PartialEmbedding(64, MEMORY_WIDTH).build()
    pe.PartialEmbedding(64, MEMORY_WIDTH, weights=np.ones([64, MEMORY_WIDTH]))
    _table_init.BLOCKED_INIT_MIN_BYTES = saved
    table_bytes = MEMORY_ROWS * MEMORY_WIDTH * 4
    source = None
    if case == "memmap":
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "table.npy")
        mapped = np.lib.format.open_memmap(
            path, mode="w+", dtype=np.float32, shape=(MEMORY_ROWS, MEMORY_WIDTH)
        )
        mapped[:] = 0.5
        mapped.flush()
        del mapped
        source = np.load(path, mmap_mode="r")
    elif case == "array":
        source = np.full([MEMORY_ROWS, MEMORY_WIDTH], 0.5, np.float32)
    layers = []

    def build() -> None:
        if source is not None:
            layers.append(pe.PartialEmbedding(MEMORY_ROWS, MEMORY_WIDTH, weights=source))
        else:
            layer = pe.PartialEmbedding(MEMORY_ROWS, MEMORY_WIDTH, embeddings_initializer=case)
            layer.build()
            layers.append(layer)

    growth = _peak_growth(build)
    first_row = layers[0].embeddings.numpy()[0]
    return {"ratio": growth / table_bytes, "first_row_mean": float(first_row.mean())}


MEMORY_CASES = ("uniform", "array", "memmap")


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory):
    """Each case's result, measured in its own fresh process (run side by side)."""
    return once_per_run(
        tmp_path_factory,
        "test_layer_construction.memory",
        lambda: _measure_every_case(tmp_path_factory),
    )


def _measure_every_case(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("memory")
    processes = {
        case: subprocess.Popen(
            [sys.executable, __file__, case, str(directory / case)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # The library's own live transients are measured, not what malloc
            # keeps of freed ones: glibc raises its mmap threshold past a
            # freed 4 MiB block, after which blocks come from per-thread heaps
            # that keep them (TensorFlow's pool threads each have one). With
            # the threshold fixed at 1 MiB every block is unmapped when freed.
            # On a 2-core AMD EPYC (2026-12-06) the uniform case measured 1.19
            # to 1.44 tables with glibc's default, 1.09 (three runs) with this.
            env={**os.environ, **seed_environment(), "MALLOC_MMAP_THRESHOLD_": "1048576"},
        )
        for case in MEMORY_CASES
    }
    results = {}
    for case, process in processes.items():
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        if process.returncode == 0:
            results[case] = json.loads(stdout.strip().splitlines()[-1])
        else:
            results[case] = {"error": stderr[-4000:]}
    return results


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
@pytest.mark.parametrize("case", MEMORY_CASES)
def test_construction_peak_memory_is_about_one_table(memory_results, case):
    result = memory_results[case]
    assert "error" not in result, result.get("error")
    # Before the change: about 3.1x (initializers) and 4.1x (weights=).
    assert result["ratio"] < 1.25, result
    if case in ("array", "memmap"):
        assert result["first_row_mean"] == 0.5


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    print(json.dumps(_measure(sys.argv[1], sys.argv[2])))
