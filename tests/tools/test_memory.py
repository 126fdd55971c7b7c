"""Peak memory of training a partially trainable table (issue #13's target).

Each measurement runs in a child process of its own, sampled from outside by
``python -m partial_embedding.bench --memory`` (``RssAnon`` of ``/proc/<pid>/status``
about every millisecond, relative to the child's baseline after imports and
a tiny warm-up; not ``ru_maxrss``, which would keep the highest mark of the
imports and of every earlier test).

The size is modest: 2**18 rows x 128 float32, a 128 MiB table, so that one
table-sized transient (128 MiB) stands far above the allowance below and the
run takes seconds.
"""

from __future__ import annotations

import io
import sys

import pytest

from partial_embedding.bench import _memory as bench_memory
from pe_testing import once_per_run

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status"
)

ROWS = 2**18
WIDTH = 128
TABLE_BYTES = ROWS * WIDTH * 4
TARGET_MULTIPLE = 1.3
# What may come on top of 1.3 tables whatever V is. Measured with the same
# model at 1,024 rows (a 0.5 MiB table): 1.5 MiB while building, 8 MiB in the
# first step (tracing the training function, Keras' data adapter, TF's
# per-step buffers), 5 MiB in the next steps. The permitted rows' own state
# here, two Adam slots of 2,621 rows x 128 float32, is 2.6 MiB (a row -> slot
# map of V int32 would add 1 MiB). 32 MiB leaves room for all of it twice
# over and is a quarter of the table: one table-sized transient does not fit.
ALLOWANCE_BYTES = 32 * 2**20


def _case(variant: str) -> bench_memory.MemoryCase:
    return bench_memory.MemoryCase(
        variant=variant,
        vocab=ROWS,
        width=WIDTH,
        permitted_fraction=0.01,
        batch=256,
        ids_per_sample=16,
        steps=3,
    )


@pytest.fixture(scope="module", params=["partial", "partial_mmap"])
def training_run(request, tmp_path_factory) -> bench_memory.MemoryMeasurement:
    return once_per_run(
        tmp_path_factory,
        f"test_memory.training_run[{request.param}]",
        lambda: bench_memory.measure_case(_case(request.param), timeout=300),
    )


@pytest.mark.slow
def test_the_run_finishes_and_reports_every_phase(training_run):
    assert training_run.ok, training_run.status
    assert set(training_run.phase_peak_bytes) == set(bench_memory.PHASES)
    # Sampled often enough to see each phase, and the table is really there.
    assert training_run.samples > 100
    assert training_run.phase_end_bytes["steady"] >= 0.9 * TABLE_BYTES


@pytest.mark.slow
def test_peak_from_construction_through_fit_is_at_most_the_target(training_run):
    assert training_run.ok, training_run.status
    limit = TARGET_MULTIPLE * TABLE_BYTES + ALLOWANCE_BYTES
    peaks_mib = {p: round(b / 2**20, 1) for p, b in training_run.phase_peak_bytes.items()}
    assert training_run.peak_bytes <= limit, (
        f"{training_run.case.variant}: peak {training_run.peak_bytes / 2**20:.1f} MiB over the "
        f"baseline ({training_run.multiple():.2f} x the {TABLE_BYTES / 2**20:.0f} MiB table; "
        f"per phase {peaks_mib}) > {TARGET_MULTIPLE} x table + "
        f"{ALLOWANCE_BYTES / 2**20:.0f} MiB"
    )


@pytest.mark.slow
def test_the_sampler_sees_a_table_sized_transient():
    # The child allocates a table-sized array, fills it and frees it at once
    # (three times), with no phase boundary in between: only sampling sees it.
    measurement = bench_memory.measure_case(_case(bench_memory.TRANSIENT), timeout=300)
    assert measurement.ok, measurement.status
    assert measurement.phase_peak_bytes["construction"] >= 0.75 * TABLE_BYTES
    assert measurement.phase_end_bytes["construction"] < 0.1 * TABLE_BYTES
    # So a transient of this size would break the target's allowance.
    assert measurement.phase_peak_bytes["construction"] > ALLOWANCE_BYTES


# -- int8 frozen rows (issue #26) ------------------------------------------------------

# Issue #26's targets for an int8 table built from a float memory-mapped file
# (1 % permitted, Adam): construction peak <= 0.35x the float32 table, steady
# state <= 0.30x. At this small size the fixed costs (a quantization block,
# Keras' per-step buffers) weigh more than at 1M rows, so the allowance above
# is added; a float table held whole (1x) would still break both.
INT8_CONSTRUCTION_TARGET = 0.35
INT8_STEADY_TARGET = 0.30


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory) -> bench_memory.MemoryMeasurement:
    return once_per_run(
        tmp_path_factory,
        "test_memory.int8_run",
        lambda: bench_memory.measure_case(_case("int8_mmap"), timeout=300),
    )


@pytest.mark.slow
def test_int8_from_a_memory_mapped_file_stays_within_its_targets(int8_run):
    assert int8_run.ok, int8_run.status
    assert set(int8_run.phase_peak_bytes) == set(bench_memory.PHASES)
    construction = int8_run.phase_peak_bytes["construction"]
    assert construction <= INT8_CONSTRUCTION_TARGET * TABLE_BYTES + ALLOWANCE_BYTES, (
        f"construction peak {construction / 2**20:.1f} MiB "
        f"({int8_run.multiple('construction'):.3f}x)"
    )
    kept = int8_run.phase_end_bytes["steady"]
    assert kept <= INT8_STEADY_TARGET * TABLE_BYTES + ALLOWANCE_BYTES, (
        f"kept {kept / 2**20:.1f} MiB ({int8_run.steady_multiple:.3f}x)"
    )
    # The int8 rows are really there: a quarter of the float table.
    assert kept >= 0.2 * TABLE_BYTES


@pytest.mark.slow
def test_int8_child_reports_its_variables_and_keeps_frozen_rows(int8_run):
    assert int8_run.ok, int8_run.status
    figures = int8_run.child_figures
    assert figures["frozen_sample_unchanged"] is True
    assert figures["frozen_sample_rows"] == 4096
    layer = {path.rsplit("/", 1)[-1]: size for path, size in figures["layer_variables"].items()}
    assert layer["embeddings"] == ROWS * WIDTH  # int8
    assert layer["embeddings_scale"] == ROWS * 4
    permitted = round(ROWS * 0.01)
    # The float store holds the permitted rows and some room (the default capacity).
    assert permitted * WIDTH * 4 < layer["float_rows"] <= 1.5 * permitted * WIDTH * 4
    output = io.StringIO()
    bench_memory.report_breakdown(int8_run, output)
    assert "int8 rows 0.2500x" in output.getvalue()
    assert "sampled frozen int8 rows and scales unchanged: True" in output.getvalue()


@pytest.mark.slow
def test_confirm_largest_trains_a_small_int8_table_in_one_child():
    from partial_embedding.bench import _quantized as quantized

    measurement = quantized.confirm_largest(2**16, width=32, steps=2, timeout=300)
    assert measurement.ok, measurement.status
    assert measurement.case.variant == "int8_init"
    assert measurement.child_figures["frozen_sample_unchanged"] is True
    output = io.StringIO()
    quantized.report_confirmation(measurement, output)
    assert "V=65,536 D=32" in output.getvalue() and "unchanged: True; finished" in output.getvalue()
    with pytest.raises(ValueError, match="variant"):
        quantized.confirm_largest(1024, variant="partial")


def test_step_times_of_float_and_int8_are_measured_in_rounds():
    from partial_embedding.bench import _quantized as quantized

    times = quantized.time_steps(2048, width=8, rounds=3, steps_per_round=2, warmup=1, batch=8)
    assert len(times.float_ms) == len(times.int8_ms) == 3
    assert min(times.float_ms + times.int8_ms) > 0
    assert times.to_dict()["ratio"] == pytest.approx(times.ratio)
    output = io.StringIO()
    quantized.report_step_times(times, output)
    assert "int8/float" in output.getvalue()


def test_an_unknown_variant_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as raised:
        bench_memory.parse_args(["--variants", "partial,int8_file"])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "--variants: unknown 'int8_file'" in error
    assert bench_memory.parse_args(["--variants", "int8_init"]).variants == "int8_init"
