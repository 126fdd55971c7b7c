"""Tests of ``python -m partial_embedding.bench``: structure, not speed.

Timings are never asserted (they depend on the machine and its load); what is
checked is that every figure the bench reports is present, finite and
consistent with the others.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pytest

from partial_embedding import bench
from partial_embedding.bench import _gpu as gpu
from partial_embedding.bench import _kernels as kernels


def _finite_positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    json_path = folder / "bench.json"
    plot_path = folder / "bench.png"
    output = io.StringIO()
    returned = kernels.run(
        kernels.parse_args(["--quick", "--json", str(json_path), "--plot", str(plot_path)]),
        stream=output,
    )
    with open(json_path, encoding="utf-8") as handle:
        written = json.load(handle)
    return {"returned": returned, "json": written, "text": output.getvalue(), "plot": plot_path}


@pytest.mark.slow
def test_json_holds_the_machine_and_every_op_point(quick_run):
    report = quick_run["json"]
    assert report["preset"] == "quick"
    assert report["machine"]["usable_cores"] >= 1
    assert report["machine"]["tensorflow"]
    preset = kernels.PRESETS["quick"]
    expected_points = [
        (name, case.num_rows, case.width) for name, cases in preset.sweeps for case in cases
    ]
    points = [(row["sweep"], row["num_rows"], row["width"]) for row in report["op"]]
    assert points == expected_points
    for row in report["op"]:
        assert set(row["seconds"]) == set(kernels.ALL_METHODS)
        assert _finite_positive(row["seconds"][kernels.BASELINE])
        for method, reason in row["skipped"].items():
            assert method in kernels.DENSE_METHODS and reason
            assert row["seconds"][method] is None and row["ratio_vs"][method] is None
        for method in set(kernels.ALL_METHODS) - set(row["skipped"]):
            assert _finite_positive(row["seconds"][method])
            assert row["repeats"][method] >= 1


@pytest.mark.slow
def test_reported_ratios_match_reported_times(quick_run):
    for row in quick_run["json"]["op"]:
        base = row["seconds"][kernels.BASELINE]
        assert row["ratio_vs"][kernels.BASELINE] == pytest.approx(1.0)
        for method, seconds in row["seconds"].items():
            if seconds is not None:
                assert row["ratio_vs"][method] == pytest.approx(base / seconds, rel=1e-12)


@pytest.mark.slow
def test_dense_methods_are_skipped_only_above_the_limit(quick_run):
    limit = kernels.PRESETS["quick"].dense_limit
    for row in quick_run["json"]["op"]:
        too_large = row["num_rows"] * row["width"] > limit
        assert bool(row["skipped"]) == too_large
    # The quick grid covers both kinds of point.
    assert any(row["skipped"] for row in quick_run["json"]["op"])
    assert any(not row["skipped"] for row in quick_run["json"]["op"])


@pytest.mark.slow
def test_table_on_screen_shows_each_point(quick_run):
    text = quick_run["text"]
    for row in quick_run["json"]["op"]:
        cell = f"{row['seconds'][kernels.BASELINE] * 1e3:9.3f}ms"
        assert cell in text
    assert "skipped" in text
    assert "below 1.0 means masked_scatter_sub is faster" in text


@pytest.mark.slow
def test_training_section_is_consistent(quick_run):
    training = quick_run["json"].get("training")
    if training is None:
        pytest.skip("the training benchmark is not available")
    variants = training["variants"]
    assert "partial" in variants and "keras" in variants
    partial_ms = variants["partial"]["step_ms"]
    for name, figures in variants.items():
        assert _finite_positive(figures["step_ms"])
        if name != "partial":
            ratio = training["ratios"][f"{name}_over_partial"]
            assert ratio == pytest.approx(figures["step_ms"] / partial_ms, rel=1e-9)
    assert training["config"]["vocab"] == kernels.PRESETS["quick"].training["vocab"]
    update_only = training["update_only"]
    if "stock_tf" in variants:
        assert _finite_positive(update_only["partial"])
        assert _finite_positive(update_only["stock_tf"])
        assert update_only["stock_tf_over_partial"] == pytest.approx(
            update_only["stock_tf"] / update_only["partial"], rel=1e-9
        )
        assert f"{update_only['partial']:.3f} ms" in quick_run["text"]


@pytest.mark.slow
def test_training_section_times_the_floors_with_the_steps(quick_run):
    training = quick_run["json"].get("training")
    if training is None:
        pytest.skip("the training benchmark is not available")
    vocab = str(training["config"]["vocab"])
    (timed_vocab,) = training["by_vocab"]
    assert timed_vocab == vocab
    together = training["by_vocab"][vocab]
    assert {"partial", "partial_xla", "stock_tf", "head_only", "head_only_xla"} <= set(together)
    # The same rounds: the steps' figures are those of the variants table.
    assert together["partial"] == training["variants"]["partial"]
    # A quick run times each step in one round: too short to resolve a
    # difference of two timings, so no embedding cost is formed or printed.
    assert together["partial"]["rounds"] < floors_module().MIN_ROUNDS
    assert training["embedding_cost"][vocab] == {}
    assert training["derived"]["partial_embedding_ms"][vocab] is None
    assert "-- timed together at each V: best round, ms" in quick_run["text"]
    assert f"{together['head_only']['step_ms']:9.3f}" in quick_run["text"]
    assert floors_module().UNRESOLVED_NOTE in quick_run["text"]


def floors_module():
    from partial_embedding.bench import _floors

    return _floors


@pytest.mark.slow
def test_quick_run_says_its_figures_are_indicative_and_names_no_target(quick_run):
    text = quick_run["text"]
    assert "indicative only" in text.splitlines()[1]
    for word in ("target", "issue", "MISS", " ok "):
        assert word not in text


@pytest.mark.slow
def test_training_section_reports_the_xla_step_against_ours(quick_run):
    training = quick_run["json"].get("training")
    if training is None:
        pytest.skip("the training benchmark is not available")
    xla_ms = training["variants"]["partial_xla"]["step_ms"]
    ratio = training["ratios"]["partial_xla_over_partial"]
    assert ratio == pytest.approx(xla_ms / training["variants"]["partial"]["step_ms"], rel=1e-9)
    assert f"partial_xla        {xla_ms:10.3f} {ratio:10.2f}" in quick_run["text"]
    update_only = training["update_only"]
    assert update_only["partial_xla_over_partial"] == pytest.approx(
        update_only["partial_xla"] / update_only["partial"], rel=1e-9
    )
    assert f"partial_xla {update_only['partial_xla']:.3f} ms" in quick_run["text"]


@pytest.mark.slow
def test_training_xla_variant_is_timed_next_to_ours_at_every_vocabulary():
    from partial_embedding.bench import _training as bench_training

    output = io.StringIO()
    config = bench_training.BenchmarkConfig(
        vocab=600,
        width=4,
        batch=4,
        ids_per_sample=2,
        steps=2,
        warmup=1,
        scaling_vocabs=(300,),
        variants=("partial", "partial_xla"),
        seed=0,
        update_only_steps=0,
    )
    report = bench_training.BenchmarkReport()
    report.say = lambda *parts: output.write(" ".join(map(str, parts)) + "\n")
    result = bench_training.measure(config, report)
    assert set(result.xla_scaling) == set(result.scaling) == {300, 600}
    assert set(result.by_vocab) == {300, 600}
    for vocab, together in result.by_vocab.items():
        assert {"partial", "partial_xla", "head_only", "head_only_xla"} <= set(together)
        assert together["partial"]["step_ms"] == result.scaling[vocab]
    for vocab, ratio in result.xla_over_partial_by_vocab.items():
        assert ratio == pytest.approx(result.xla_scaling[vocab] / result.scaling[vocab])
    assert result.xla_scaling_ratio == pytest.approx(
        result.xla_scaling[600] / result.xla_scaling[300]
    )
    figures = result.as_dict()
    assert figures["ratios"]["partial_xla_over_partial"] == pytest.approx(
        figures["xla_over_partial_by_vocab"][600]
    )
    text = output.getvalue()
    assert "partial_xla_over_partial" in text
    assert f"{result.xla_over_partial_by_vocab[300]:.2f}x partial" in text
    assert "partial_xla step time V=600 / V=300" in text
    printed = io.StringIO()
    kernels.report_training(figures, printed)
    assert f"({result.xla_over_partial_by_vocab[300]:.2f}x partial)" in printed.getvalue()


@pytest.mark.slow
def test_gpu_section_is_absent_or_complete(quick_run):
    gpu = quick_run["json"]["gpu"]
    if gpu is None:
        assert "-- gpu:" in quick_run["text"] and "skipped" in quick_run["text"]
        return
    for row in gpu["rows"]:
        assert row["op_GBps"] == pytest.approx(row["moved_bytes"] / (row["op_ms"] * 1e-3) / 1e9)
        assert row["fraction_of_copy"] == pytest.approx(row["copy_ms"] / row["op_ms"])


@pytest.mark.slow
def test_plot_is_a_png_when_matplotlib_is_there(quick_run):
    pytest.importorskip("matplotlib")
    with open(quick_run["plot"], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_moved_bytes_counts_permitted_rows_once():
    case = kernels.OpCase(num_rows=10, width=4, num_indices=5)
    inputs = {
        "indices": np.array([1, 1, 2, 3, 9], dtype=np.int64),
        "row_mask": np.array([True, True, False, True] + [False] * 6),
    }
    # 5 ids of 8 bytes + 1 mask byte; 3 permitted update rows (1, 1, 3);
    # 2 distinct permitted table rows, read and written.
    expected = 5 * 9 + 3 * 16 + 2 * 2 * 16
    assert gpu.moved_bytes(case, inputs, 4) == expected


def test_the_earlier_functions_keep_working():
    case = kernels.OpCase(num_rows=1000, width=8, num_indices=64, permitted_fraction=0.5)
    seconds = kernels.time_op_case(case, ("masked_scatter_sub", "scatter_sub"), repeats=2, rounds=1)
    assert set(seconds) == {"masked_scatter_sub", "scatter_sub"}
    rows = kernels.run_op_benchmark([case], ("masked_scatter_sub",), 2, 1, stream=io.StringIO())
    assert rows[0]["num_rows"] == 1000 and rows[0]["ratio_vs"]["masked_scatter_sub"] == 1.0


# -- the training benchmark's floors and derived figures (no timing) ------------


def _figures(step_ms: float, rounds: int = 5) -> dict[str, float]:
    return {
        "step_ms": step_ms,
        "mean_step_ms": step_ms,
        "median_step_ms": step_ms,
        "steps": 10 * rounds,
        "rounds": rounds,
    }


def test_a_difference_of_two_timings_is_formed_only_where_the_run_resolves_it():
    from partial_embedding.bench import _floors as floors

    step = {"step_ms": 2.0, "median_step_ms": 2.3, "rounds": 5}
    floor = {"step_ms": 1.5, "median_step_ms": 1.6, "rounds": 5}
    assert floors.resolved_difference(step, floor) == pytest.approx(0.5)
    # Spreads of 0.3 + 0.3 exceed the 0.5 difference: noise could make it.
    assert floors.resolved_difference(step, {**floor, "median_step_ms": 1.8}) is None
    # Too few rounds to weigh it at all (a quick run's single round).
    assert floors.resolved_difference({**step, "rounds": 2}, floor) is None
    assert floors.resolved_difference(step, {"step_ms": 1.5, "median_step_ms": 1.5}) is None
    # A negative difference is never shown.
    assert floors.resolved_difference(floor, step) is None


def _together(partial, xla, stock, head, head_xla, bare):
    names = ("partial", "partial_xla", "stock_tf", "head_only", "head_only_xla", "bare_loop")
    times = (partial, xla, stock, head, head_xla, bare)
    return {name: _figures(ms) for name, ms in zip(names, times) if ms is not None}


def _by_vocab():
    return {
        100_000: _together(2.5, 2.4, 5.0, 2.0, 1.9, 0.2),
        1_000_000: _together(2.6, 3.0, 6.0, 2.0, 1.8, 0.4),
        4_000_000: _together(2.9, 3.5, 6.2, 2.05, None, None),
    }


def test_embedding_costs_and_derived_figures_follow_from_the_floors():
    from partial_embedding.bench import _floors as floors

    by_vocab = _by_vocab()
    costs = floors.embedding_costs(by_vocab[1_000_000])
    assert costs == pytest.approx({"partial": 0.6, "partial_xla": 1.2, "stock_tf": 4.0})
    # Without an XLA head-only floor, the XLA step is measured against the other.
    assert floors.embedding_costs(by_vocab[4_000_000])["partial_xla"] == pytest.approx(1.45)
    targets = floors.derived_figures(by_vocab)
    assert targets["partial_embedding_ms"] == pytest.approx(
        {100_000: 0.5, 1_000_000: 0.6, 4_000_000: 0.85}
    )
    assert targets["stock_tf_over_partial_embedding"][1_000_000] == pytest.approx(4.0 / 0.6)
    assert targets["partial_embedding_over_bare_loop"][100_000] == pytest.approx(2.5)
    assert targets["partial_embedding_over_bare_loop"][4_000_000] is None
    assert targets["xla_over_partial_step"][1_000_000] == pytest.approx(3.0 / 2.6)
    assert targets["partial_step_flatness"] == pytest.approx(2.9 / 2.5)
    assert targets["partial_xla_step_flatness"] == pytest.approx(3.5 / 2.4)
    # An embedding cost lost in noise gives no cost and no ratio, never a negative one.
    noisy = floors.derived_figures({10: _together(1.0, 1.0, 2.0, 1.1, 1.0, 0.1)})
    assert noisy["partial_embedding_ms"][10] is None
    assert noisy["stock_tf_over_partial_embedding"][10] is None
    assert noisy["partial_step_flatness"] is None


def test_vocab_table_shows_each_figure_with_no_target():
    from partial_embedding.bench import _floors as floors
    from partial_embedding.bench import _training_results as training_report

    by_vocab = _by_vocab()
    result = {
        "by_vocab": by_vocab,
        "embedding_cost": {v: floors.embedding_costs(f) for v, f in by_vocab.items()},
        "derived": floors.derived_figures(by_vocab),
    }
    # The same table from the figures and from their JSON form.
    text = training_report.vocab_table(result)
    assert training_report.vocab_table(json.loads(json.dumps(result))) == text
    lines = text.splitlines()
    assert lines[0].split()[-3:] == ["V=100,000", "V=1,000,000", "V=4,000,000"]
    (head_xla,) = [line for line in lines if line.startswith("  head_only_xla")]
    assert head_xla.split()[-3:] == ["1.900", "1.800", "-"]
    (stock,) = [line for line in lines if line.startswith("  stock_tf / partial")]
    assert stock.split()[-3:] == ["6.00", "6.67", "4.88"]
    (xla,) = [line for line in lines if line.startswith("  partial_xla step / partial")]
    assert xla.split()[-3:] == ["0.96", "1.15", "1.21"]
    assert "step V=4,000,000 / V=100,000: partial 1.16x, partial_xla 1.46x" in text
    assert "target" not in text and "MISS" not in text and floors.UNRESOLVED_NOTE not in text
    assert training_report.vocab_table({"by_vocab": {}}) == ""
    # A run too short to resolve the costs shows "-" for them and says why.
    short = {v: {n: _figures(f["step_ms"], 1) for n, f in b.items()} for v, b in by_vocab.items()}
    text = training_report.vocab_table(
        {"by_vocab": short, "derived": floors.derived_figures(short), "embedding_cost": {}}
    )
    (cost,) = [line for line in text.splitlines() if line.startswith("    partial - head_only")]
    assert cost.split()[-3:] == ["-", "-", "-"]
    assert floors.UNRESOLVED_NOTE in text


def test_what_memory_does_not_allow_is_left_out_and_said(monkeypatch):
    from partial_embedding.bench import _timing as timing
    from partial_embedding.bench import _training_results as training_report

    monkeypatch.setattr(timing, "_available_bytes", lambda: 10 * 2**30)
    assert timing.lacks_room_for(7 * 2**30) is None
    reason = timing.lacks_room_for(8 * 2**30)
    assert reason == "needs ~8.0 GiB, 10.0 GiB available"
    monkeypatch.setattr(timing, "_available_bytes", lambda: None)
    assert timing.lacks_room_for(2**50) is None
    by_vocab = _by_vocab()
    text = training_report.vocab_table(
        {"by_vocab": by_vocab, "skipped": {"4000000": {"bare_loop": reason}}}
    )
    assert f"not timed at V=4,000,000: bare_loop ({reason})" in text


def test_a_group_leaves_out_only_what_may_be_skipped(monkeypatch):
    import tensorflow as tf

    from partial_embedding.bench import _training as bench_training

    monkeypatch.setattr(bench_training, "lacks_room_for", lambda nbytes: "no room")
    config = bench_training.BenchmarkConfig(vocab=50, width=4, batch=2, ids_per_sample=2)
    batches = [(tf.constant([[1, 2], [3, 4]]), tf.constant([[0.5], [1.0]]))]
    runs, kept, skipped = bench_training._build_runs(
        ["stock_tf", "partial", "partial_xla"],
        config,
        batches,
        np.random.default_rng(0),
        with_floors=True,
    )
    assert list(runs) == ["partial", "partial_xla", "head_only", "head_only_xla"]
    assert skipped == {"stock_tf": "no room", "bare_loop": "no room"}
    assert kept


def test_a_size_at_which_even_our_steps_do_not_fit_is_left_out(monkeypatch):
    from partial_embedding.bench import _training as bench_training

    monkeypatch.setattr(bench_training, "lacks_room_for", lambda nbytes: "no room")
    config = bench_training.BenchmarkConfig(
        vocab=50, width=4, scaling_vocabs=(100,), variants=("partial", "partial_xla", "stock_tf")
    )
    result = bench_training.TrainingBenchmark(config, {"partial": _figures(1.0)})
    report = bench_training.BenchmarkReport()
    said = []
    report.say = said.append
    bench_training._time_scaling(config, result, np.random.default_rng(0), report)
    assert result.skipped == {100: {"partial": "no room", "partial_xla": "no room"}}
    assert result.scaling_points == [] and 100 not in result.by_vocab
    assert any("not timed at V=100: no room" in line for line in said)
    with pytest.raises(MemoryError, match="partial, partial_xla at V=50: no room; nothing"):
        bench_training.measure(config)


def test_each_other_size_can_be_timed_in_a_process_of_its_own(monkeypatch):
    from partial_embedding.bench import _training as bench_training

    config = bench_training.BenchmarkConfig(
        vocab=50,
        width=4,
        steps=7,
        seed=3,
        scaling_vocabs=(100,),
        variants=("partial", "partial_xla", "stock_tf", "keras"),
        isolate_scaling=True,
    )
    arguments = bench_training._child_arguments(config, 100)
    child = bench_training.BenchmarkConfig(
        **{
            name: value
            for name, value in vars(bench_training._parser().parse_args(arguments)).items()
            if name not in ("runs", "json")
        }
    )
    assert child == dataclasses.replace(
        config,
        vocab=100,
        scaling_vocabs=[],
        variants=["partial", "partial_xla", "stock_tf"],
        update_only_steps=0,
        isolate_scaling=False,
    )
    together = _together(2.0, 2.5, 4.0, 1.0, 1.1, 0.5)
    seen = []

    def fake_child(arguments, quiet):
        seen.append((arguments, quiet))
        return {"by_vocab": {"100": together}, "skipped": {"100": {"bare_loop": "why"}}}

    monkeypatch.setattr(bench_training, "_run_in_child", fake_child)
    result = bench_training.TrainingBenchmark(config, {})
    bench_training._time_scaling(
        config, result, np.random.default_rng(0), bench_training.BenchmarkReport(False)
    )
    assert seen == [(arguments, True)]
    assert result.by_vocab == {100: together} and result.skipped == {100: {"bare_loop": "why"}}
    assert result.scaling_points == [(100, together["partial"])]
    monkeypatch.setattr(bench_training, "_run_in_child", lambda arguments, quiet: None)
    figures, skipped = bench_training._scaling_point(config, 100, np.random.default_rng(0))
    assert figures == {} and set(skipped) == {"partial", "partial_xla"}


def test_runs_summary_lists_every_run_in_order():
    from partial_embedding.bench import _floors as floors
    from partial_embedding.bench import _training_results as training_report

    first, second = _by_vocab(), _by_vocab()
    second[1_000_000]["partial"] = _figures(2.4)
    results = [{"by_vocab": b, "derived": floors.derived_figures(b)} for b in (first, second)]
    text = training_report.runs_summary(results)
    assert text.startswith("== 2 runs: derived figures, run by run")
    (cost,) = [line for line in text.splitlines() if "partial embedding cost (ms)" in line]
    assert cost.split()[-6:] == ["0.50", "0.50", "0.60", "0.40", "0.85", "0.85"]


def test_training_main_repeats_the_run_and_writes_every_run(tmp_path, monkeypatch, capsys):
    from partial_embedding.bench import _floors as floors
    from partial_embedding.bench import _training as bench_training

    calls = []

    def fake_child(arguments):
        calls.append(list(arguments))
        if len(calls) == 2:
            return None  # a run that failed is left out
        by_vocab = _by_vocab()
        return {
            "by_vocab": by_vocab,
            "derived": floors.derived_figures(by_vocab),
            "run": len(calls),
        }

    bag_calls = []

    def fake_bags(arguments):
        bag_calls.append(list(arguments))
        return {"runs": [{"bag": "run"}]}

    monkeypatch.setattr(bench_training, "_run_in_child", fake_child)
    monkeypatch.setattr(bench_training.bags, "main", fake_bags)
    path = tmp_path / "training.json"
    arguments = ["--runs", "3", "--vocab", "1000", "--no-floors", "--json", str(path)]
    returned = bench_training.main(arguments)
    assert [run["run"] for run in returned["runs"]] == [1, 3]
    assert calls == [arguments] * 3
    # The bag model follows, as many runs (its own processes: not run here).
    assert bag_calls == [["--runs", "3", "--optimizer", "adam"]]
    assert returned["bags"] == [{"bag": "run"}]
    saved = json.loads(path.read_text())
    assert saved["runs"][1]["run"] == 3 and saved["bags"] == [{"bag": "run"}]
    printed = capsys.readouterr().out
    assert "== run 3 of 3" in printed and "== 2 runs: derived figures" in printed
    with pytest.raises(SystemExit, match="--runs"):
        bench_training.main(["--runs", "0"])


def test_one_run_in_a_child_process_comes_back_whole(tmp_path, monkeypatch):
    import subprocess

    from partial_embedding.bench import _training as bench_training

    commands = []

    def fake_run(command, check, stdout=None):
        commands.append(command)
        json_path = command[command.index("--json", command.index("--runs")) + 1]
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"runs": [{"from": "child"}]}, handle)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(bench_training.subprocess, "run", fake_run)
    assert bench_training._run_in_child(["--vocab", "7", "--runs", "3"]) == {"from": "child"}
    (command,) = commands
    assert command[1:3] == ["-m", "partial_embedding.bench._training"]
    assert command[3:8] == ["--vocab", "7", "--runs", "3", "--runs"] and command[8] == "1"
    monkeypatch.setattr(
        bench_training.subprocess,
        "run",
        lambda command, check, stdout=None: subprocess.CompletedProcess(command, 9),
    )
    assert bench_training._run_in_child([]) is None


def test_bare_loop_floor_applies_lazy_adam_to_the_permitted_rows_only():
    from partial_embedding.bench import _floors as floors

    rng = np.random.default_rng(0)
    vocab, width = 40, 4
    permitted = rng.random(vocab) < 0.5
    loop = floors.bare_loop_step(vocab, width, permitted, rng)
    if loop is None:
        pytest.skip("partial_embedding._kernels is not built")
    before = loop.table.copy()
    ids = np.array([3, 7, 3, 11, 20, 7, 3, 39], np.int32)
    gradient = rng.normal(size=(ids.size, width)).astype(np.float32)
    loop(ids, loop.slot_of_row[ids], gradient)
    # float64 reference of one lazy Adam step from zero moments.
    expected = before.astype(np.float64)
    for row in set(ids.tolist()):
        if permitted[row]:
            g = gradient[ids == row].astype(np.float64).sum(axis=0)
            m, v = 0.1 * g, 0.001 * g * g
            alpha = 1e-3 * np.sqrt(1 - 0.999) / (1 - 0.9)
            expected[row] -= alpha * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(loop.table, expected, rtol=1e-5, atol=1e-7)
    frozen = ~permitted
    assert np.array_equal(loop.table[frozen].view(np.uint32), before[frozen].view(np.uint32))
    moved = sorted(row for row in set(ids.tolist()) if permitted[row])
    assert moved and np.all(np.any(loop.table[moved] != before[moved], axis=1))


# -- the memory benchmark (partial_embedding.bench.memory) ----------------------


def _memory_measurement(variant="partial", vocab=1000, peaks=(300, 500, 400), optimizer=None):
    from partial_embedding.bench import _memory as bench_memory

    case = bench_memory.MemoryCase(variant=variant, vocab=vocab, width=4)
    return bench_memory.MemoryMeasurement(
        case=case,
        baseline_anon_bytes=10_000,
        baseline_rss_bytes=50_000,
        phase_peak_bytes=dict(zip(bench_memory.PHASES, [p * 16 for p in peaks])),
        phase_end_bytes=dict(zip(bench_memory.PHASES, [p * 8 for p in peaks])),
        optimizer_bytes=optimizer,
    )


def test_memory_measurement_figures_are_multiples_of_the_table():
    measurement = _memory_measurement(peaks=(300, 500, 400), optimizer=32_000)
    assert measurement.case.table_bytes == 1000 * 4 * 4
    assert measurement.peak_bytes == 500 * 16
    assert measurement.multiple() == pytest.approx(0.5)
    assert measurement.multiple("construction") == pytest.approx(0.3)
    assert measurement.optimizer_multiple == pytest.approx(2.0)
    as_dict = json.loads(json.dumps(measurement.to_dict()))
    assert as_dict["peak_multiple"] == pytest.approx(0.5)
    assert as_dict["phase_multiple"]["steady"] == pytest.approx(0.4)
    assert as_dict["case"]["variant"] == "partial" and as_dict["status"] == "ok"
    from partial_embedding.bench import _memory as bench_memory

    assert bench_memory.MemoryMeasurement.from_dict(as_dict) == measurement
    assert _memory_measurement(optimizer=None).optimizer_multiple is None


def test_peak_line_goes_through_two_points_and_is_cautious_with_one():
    from partial_embedding.bench import _memory as bench_memory

    fixed, slope = bench_memory.fit_peak_line([(100, 1000 + 500), (400, 1000 + 2000)])
    assert slope == pytest.approx(5.0) and fixed == pytest.approx(1000.0)
    # One point, or a slope that noise made negative: through the origin.
    assert bench_memory.fit_peak_line([(100, 600)]) == (0.0, pytest.approx(6.0))
    assert bench_memory.fit_peak_line([(100, 900), (400, 800)]) == (0.0, pytest.approx(2.0))
    with pytest.raises(ValueError, match="points"):
        bench_memory.fit_peak_line([])


def test_largest_table_leaves_the_margin_the_process_and_the_fixed_part_free():
    from partial_embedding.bench import _memory as bench_memory

    mib = 2**20
    largest = bench_memory.predict_largest(
        "partial",
        [(100 * mib, 64 * mib + 300 * mib), (200 * mib, 64 * mib + 600 * mib)],
        width=128,
        process_bytes=500 * mib,
        budget_bytes=10_000 * mib,
        memory_total_bytes=20_000 * mib,
        margin=0.1,
        row_multiple=1,
    )
    # 10,000 MiB x 0.9 - 500 MiB - 64 MiB = 8,436 MiB at 3 bytes a table byte.
    expected_table = (9000 - 500 - 64) * mib / 3
    assert largest.per_table_byte == pytest.approx(3.0)
    assert largest.fixed_bytes == pytest.approx(64 * mib)
    assert largest.rows == int(expected_table // 512)
    assert largest.table_bytes == largest.rows * 512
    assert largest.fraction_of_memory == pytest.approx(largest.table_bytes / (20_000 * mib))
    assert largest.rows_at_memory_total == int(((18_000 - 564) * mib / 3) // 512)
    assert largest.confirmed is None
    rounded = bench_memory.predict_largest(
        "partial",
        [(100 * mib, 300 * mib)],
        width=128,
        process_bytes=0,
        budget_bytes=1000 * mib,
        memory_total_bytes=1000 * mib,
    )
    assert rounded.rows % 1024 == 0 and rounded.rows > 0
    nothing = bench_memory.predict_largest(
        "keras",
        [(100 * mib, 300 * mib)],
        width=128,
        process_bytes=2000 * mib,
        budget_bytes=1000 * mib,
        memory_total_bytes=1000 * mib,
    )
    assert nothing.rows == 0


def test_benchmark_ratio_and_report(tmp_path):
    from partial_embedding.bench import _memory as bench_memory

    measurements = [_memory_measurement("partial"), _memory_measurement("keras")]
    common = dict(width=4, process_bytes=0, budget_bytes=2**20, memory_total_bytes=2**20)
    largest = {
        "partial": bench_memory.predict_largest(
            "partial", [(16_000, 8_000)], row_multiple=1, **common
        ),
        "keras": bench_memory.predict_largest(
            "keras", [(16_000, 32_000)], row_multiple=1, **common
        ),
    }
    largest["keras"].confirmation = dataclasses.replace(measurements[1], status="killed: test")
    result = bench_memory.MemoryBenchmark({"cpus": 1}, measurements, largest)
    assert result.largest_ratio == pytest.approx(largest["partial"].rows / largest["keras"].rows)
    assert result.largest_ratio == pytest.approx(4.0, rel=1e-3)
    as_dict = json.loads(json.dumps(result.to_dict()))
    assert as_dict["largest"]["keras"]["confirmed"] is False
    assert as_dict["largest_ratio_partial_over_keras"] == pytest.approx(result.largest_ratio)
    output = io.StringIO()
    bench_memory.report(result, output)
    text = output.getvalue()
    assert "0.50x" in text and "did not finish (killed: test)" in text
    assert "ours / stock Keras: 4.00x" in text


def test_memory_svg_is_xml_with_a_bar_per_configuration_and_phase(tmp_path):
    import xml.etree.ElementTree as ElementTree

    from partial_embedding.bench import _memory as bench_memory

    measurements = [
        _memory_measurement("partial", 1000),
        _memory_measurement("keras", 1000, peaks=(300, 700, 900)),
        _memory_measurement("stock_tf", 4000, peaks=(1, 2, 3)),
    ]
    path = tmp_path / "memory.svg"
    bench_memory.write_svg(measurements, str(path), title="a <title> & more")
    root = ElementTree.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "bar"]
    assert len(bars) == len(measurements) * len(bench_memory.PHASES)
    assert {(bar.get("data-config"), bar.get("data-phase")) for bar in bars} == {
        (m.case.label, phase) for m in measurements for phase in bench_memory.PHASES
    }
    # Taller bars for larger multiples.
    heights = {
        (bar.get("data-config"), bar.get("data-phase")): float(bar.get("height")) for bar in bars
    }
    keras_label = measurements[1].case.label
    assert heights[(keras_label, "steady")] > heights[(keras_label, "construction")]


@pytest.mark.slow
def test_bench_memory_flag_runs_the_memory_benchmark(tmp_path, capsys):
    json_path = tmp_path / "memory.json"
    svg_path = tmp_path / "memory.svg"
    bench.main(
        [
            "--memory",
            "--vocabs",
            "4096",
            "--dim",
            "64",
            "--variants",
            "numpy_transient",
            "--skip-largest",
            "--json",
            str(json_path),
            "--svg",
            str(svg_path),
        ]
    )
    with open(json_path, encoding="utf-8") as handle:
        written = json.load(handle)
    (only,) = written["measurements"]
    assert only["status"] == "ok" and only["case"]["vocab"] == 4096
    assert set(only["phase_peak_bytes"]) == {"construction", "first_step", "steady"}
    assert svg_path.read_text(encoding="utf-8").startswith("<svg")
    assert "numpy_transient" in capsys.readouterr().out


# -- every command parses its flags -----------------------------------------

_COMMANDS = [
    (
        "partial_embedding.bench",
        [],
        [
            "--quick",
            "--full",
            "--memory",
            "--training",
            "--lm",
            "--gpu-step",
            "--bags",
            "--int8",
            "--versus-fbgemm",
        ],
    ),
    ("partial_embedding.bench", ["--memory"], ["--vocabs", "--dim", "--svg", "--budget-gib"]),
    (
        "partial_embedding.bench",
        ["--training"],
        ["--variants", "--scaling-vocabs", "--runs", "--json", "--no-floors", "--optimizer"],
    ),
    ("partial_embedding.bench", ["--lm"], ["--vocab-sizes", "--new-tokens"]),
    ("partial_embedding.bench", ["--gpu-step"], ["--seed", "--vocabs", "--no-timing", "--json"]),
    (
        "partial_embedding.bench",
        ["--bags"],
        ["--vocabs", "--memory-lengths", "--runs", "--optimizer"],
    ),
    ("partial_embedding.bench", ["--int8"], ["--confirm-largest", "--step-time"]),
    ("partial_embedding.demo", [], ["--vocab-size", "--optimizer", "--no-baseline", "--lm"]),
    ("partial_embedding.demo", ["--lm"], ["--new-tokens", "--length", "--learning-rate"]),
]


@pytest.mark.parametrize(
    "module, flags, listed", _COMMANDS, ids=[f"{m} {' '.join(f)}" for m, f, _ in _COMMANDS]
)
def test_every_command_lists_its_flags_under_help(module, flags, listed, monkeypatch, capsys):
    """``python -m MODULE [FLAG] --help`` exits 0 and lists the flags, running nothing."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [module, *flags, "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert "usage:" in printed
    for flag in listed:
        assert flag in printed, (module, flags, flag)


def test_two_benchmarks_at_once_is_refused():
    with pytest.raises(SystemExit, match="choose one of"):
        bench.main(["--memory", "--lm"])
