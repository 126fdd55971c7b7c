"""Row-admission benchmark: what admitting and evicting rows adds to a training step.

Run ``python -m partial_embedding.bench --training --admission`` (``--help``
for options). The per-id model of ``bench._training`` (``V x D`` ids
mean-pooled into a ``Dense(1)``, MSE, ``MaskedOptimizer`` around Adam unless
``--optimizer`` names another rule, the step a ``tf.function`` without XLA)
is built three ways and fed the same stream of ids:

* ``plain``: ``PartialEmbedding`` without admission;
* ``admitting``: ``RowAdmission(min_count=2)`` (``--min-count``), no
  capacity: never evicts;
* ``evicting``: ``RowAdmission(min_count=2, capacity=C)``, LFU
  (``--eviction``), with ``C`` a quarter above the distinct candidate ids of
  a batch (mean over the stream) unless ``--capacity`` says: once full, a
  batch's new rows evict.

The ids follow a Zipf law (``numpy.random.default_rng(seed).zipf(a)``, ``a =
1.2`` by default): rank ``r`` is folded into ``[0, V)`` as ``(r - 1) mod V``
and mapped to an id by a fixed random permutation, so the frequent rows lie
anywhere in the table. Each model takes ``--warmup`` steps of the stream
untimed (tracing), then the next steps in the interleaved rounds of
``bench._timing`` (``plain``, ``admitting``, ``evicting``, then the reverse
order...): every model sees the same batches in the same order.

The timed steps are ``bench._models.keras_step``, as the training benchmark
times them. The admissions and evictions are counted apart, untimed: the
same stream, in the same order, is fed to a layer with each admission policy
and a table one column wide (the admission's decisions depend on the ids
alone), and the admitted set read after every batch; a row admitted is one
that joined it, a row evicted one that left it. Each counting layer's final
admitted set is checked against its timed model's (``counts_agree``).

Printed: each step's best and median round, the ratios ``admitting / plain``
and ``evicting / plain`` (best rounds and medians, timed in the same rounds),
and per admission model the rows admitted and evicted and the steps that
evicted, over the timed steps and over the whole stream, the rows admitted
at the end and the most at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench._models import (  # noqa: E402  # noqa: E402
    DEFAULT_RULE,
    RULES,
    keras_step,
    make_optimizer,
    pooled_model,
)
from partial_embedding.bench._timing import (  # noqa: E402
    interleaved_rounds,
    lacks_room_for,
    release_memory,
)
from partial_embedding.layers import PartialEmbedding, RowAdmission  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402

#: The models, in the order of the rounds.
MODELS = ("plain", "admitting", "evicting")
#: What the counting pass counts over a span of the stream.
COUNTS = ("admissions", "evictions", "steps_that_evicted", "steps")


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """What one run measures (the defaults: a 1M x 128 table, 256 x 16 ids).

    Attributes:
      vocab, width: The table ``V x D``.
      batch, ids_per_sample: Each step looks up ``batch x ids_per_sample`` ids.
      permitted_fraction: Share of rows that are candidates (trainable), drawn
        exactly; 1.0: every row.
      zipf_exponent: The Zipf law's ``a`` (> 1).
      min_count: Batches a candidate must appear in before it trains.
      capacity: Most rows ``evicting`` admits at once; None: a quarter above
        the mean distinct candidate ids of a batch.
      eviction: ``"lfu"`` or ``"lru"``.
      steps: Timed steps of each model, over all rounds.
      max_rounds: Most interleaved rounds (each of at least 10 steps).
      warmup: Untimed steps of each model first (at least 1: the trace).
      seed: Seed of the ids, the candidates and the targets.
      optimizer: The rule of ``bench._models.RULES`` inside ``MaskedOptimizer``.
    """

    vocab: int = 1_000_000
    width: int = 128
    batch: int = 256
    ids_per_sample: int = 16
    permitted_fraction: float = 1.0
    zipf_exponent: float = 1.2
    min_count: int = 2
    capacity: int | None = None
    eviction: str = "lfu"
    steps: int = 100
    max_rounds: int = 5
    warmup: int = 10
    seed: int = 0
    optimizer: str = DEFAULT_RULE

    @property
    def stream_length(self) -> int:
        """Batches each model may take: the warm-up and the timed steps."""
        return self.warmup + self.steps


# -- the stream ----------------------------------------------------------------------


def candidate_mask(config: AdmissionConfig) -> np.ndarray | None:
    """Exactly ``round(vocab * permitted_fraction)`` candidate rows, drawn
    from the seed (bool ``[V]``); None where every row is one."""
    if config.permitted_fraction >= 1.0:
        return None
    permitted = np.zeros(config.vocab, bool)
    count = round(config.vocab * config.permitted_fraction)
    rng = np.random.default_rng([config.seed, 1])
    permitted[rng.choice(config.vocab, count, replace=False)] = True
    return permitted


def zipf_stream(config: AdmissionConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """``stream_length`` batches of ids (int32 ``[batch, ids_per_sample]``,
    Zipf-distributed as the module says) and targets (float32 ``[batch, 1]``)."""
    rng = np.random.default_rng(config.seed)
    id_of_rank = rng.permutation(config.vocab)
    shape = (config.batch, config.ids_per_sample)
    return [
        (
            id_of_rank[(rng.zipf(config.zipf_exponent, shape) - 1) % config.vocab].astype(np.int32),
            rng.normal(size=(config.batch, 1)).astype(np.float32),
        )
        for _ in range(config.stream_length)
    ]


def distinct_candidates_per_batch(
    stream: Sequence[tuple[np.ndarray, np.ndarray]], candidates: np.ndarray | None
) -> float:
    """The mean count of distinct candidate ids in a batch of ``stream``."""
    counts = []
    for ids, _ in stream:
        distinct = np.unique(ids)
        counts.append(len(distinct) if candidates is None else int(candidates[distinct].sum()))
    return float(np.mean(counts))


def default_capacity(distinct_per_batch: float) -> int:
    """A quarter above ``distinct_per_batch``: once full, a batch's new rows
    evict admitted rows absent from it."""
    return max(1, round(1.25 * distinct_per_batch))


# -- the models ------------------------------------------------------------------------


def _admissions(config: AdmissionConfig, capacity: int) -> dict[str, RowAdmission | None]:
    return {
        "plain": None,
        "admitting": RowAdmission(min_count=config.min_count),
        "evicting": RowAdmission(
            min_count=config.min_count, capacity=capacity, eviction=config.eviction
        ),
    }


def _timed_model(
    admission: RowAdmission | None, config: AdmissionConfig, candidates: np.ndarray | None
) -> tuple[PartialEmbedding, Callable[..., tf.Tensor], list[Any]]:
    """The layer, the training step (``bench._models.keras_step``) and the
    objects the step keeps alive."""
    layer = PartialEmbedding(
        config.vocab, config.width, trainable_ids=candidates, admission=admission
    )
    model = pooled_model(layer, config.ids_per_sample)
    optimizer = MaskedOptimizer(make_optimizer(config.optimizer))
    return layer, keras_step(model, optimizer), [model, optimizer]


def _feeder(
    step: Callable[..., tf.Tensor], batches: Sequence[tuple[tf.Tensor, tf.Tensor]]
) -> Callable[[], tf.Tensor]:
    """A call that runs ``step`` on the stream's next batch: every model
    takes the batches in order, whatever rounds call it."""
    upcoming: Iterator[tuple[tf.Tensor, tf.Tensor]] = iter(batches)
    return lambda: step(*next(upcoming))


def _tables_bytes(config: AdmissionConfig) -> float:
    """About what the three models hold: ``plain`` a table and two full-size
    Adam slots at most, the others a table and slots for the rows they admit,
    and a table's worth of temporaries (4.4 GB peak RSS at the defaults)."""
    return 6 * config.vocab * config.width * 4


# -- counting ----------------------------------------------------------------------------


def count_admissions(
    admission: RowAdmission,
    config: AdmissionConfig,
    candidates: np.ndarray | None,
    stream: Sequence[tuple[np.ndarray, np.ndarray]],
    timed_from: int,
) -> tuple[dict[str, dict[str, int]], np.ndarray]:
    """Feeds ``stream`` to a one-column layer with ``admission``, eagerly,
    and counts from its admitted set after every batch.

    Returns:
      ``{"timed": counts of the batches from ``timed_from`` on, "stream":
      counts of them all, with "admitted_at_end" and "most_admitted"}``
      (counts: "admissions", "evictions", "steps_that_evicted", "steps"),
      and the admitted ids at the end.
    """
    layer = PartialEmbedding(config.vocab, 1, trainable_ids=candidates, admission=admission)
    layer.build()
    admitted = np.zeros([0], np.int64)
    spans: dict[str, dict[str, int]] = {
        span: dict.fromkeys(COUNTS, 0) for span in ("timed", "stream")
    }
    most = 0
    for position, (ids, _) in enumerate(stream):
        layer(ids, training=True)
        now = layer.admitted_ids
        joined = np.setdiff1d(now, admitted, assume_unique=True).size
        left = np.setdiff1d(admitted, now, assume_unique=True).size
        for span in ("timed", "stream") if position >= timed_from else ("stream",):
            counts = spans[span]
            counts["admissions"] += joined
            counts["evictions"] += left
            counts["steps_that_evicted"] += int(left > 0)
            counts["steps"] += 1
        most = max(most, now.size)
        admitted = now
    spans["stream"].update(admitted_at_end=int(admitted.size), most_admitted=most)
    return spans, admitted


# -- one measurement ---------------------------------------------------------------------


def measure_admission(config: AdmissionConfig) -> dict[str, Any]:
    """Times the three models' steps in the same interleaved rounds, then
    counts the admissions and evictions of the stream they took.

    Returns:
      ``{"config": the settings (``capacity`` as used), "distinct_per_batch":
      mean distinct candidate ids a batch, "figures": {model:
      ``RoundFigures.summary``}, "ratios": {"admitting_over_plain",
      "evicting_over_plain"} of the best rounds, "median_ratios": the same of
      the medians, "timed" and "stream": {admission model: counts of
      ``count_admissions``}, "counts_agree": {admission model: whether the
      counting layer ended with the timed model's admitted rows}}``.

    Raises:
      ValueError: ``warmup < 1`` or ``steps < 1``.
      MemoryError: the three models do not fit in free memory (checked first).
    """
    if config.warmup < 1 or config.steps < 1:
        raise ValueError(
            f"warmup and steps: must be at least 1, got {config.warmup}, {config.steps}"
        )
    if reason := lacks_room_for(_tables_bytes(config)):
        raise MemoryError(f"the three models at V={config.vocab:,}: {reason}; nothing was timed")
    candidates = candidate_mask(config)
    stream = zipf_stream(config)
    distinct = distinct_candidates_per_batch(stream, candidates)
    capacity = config.capacity or default_capacity(distinct)
    config = dataclasses.replace(config, capacity=capacity)
    admissions = _admissions(config, capacity)
    batches = [(tf.constant(ids), tf.constant(targets)) for ids, targets in stream]
    models = {
        name: _timed_model(admission, config, candidates) for name, admission in admissions.items()
    }
    runs = {name: (_feeder(step, batches), [()]) for name, (_, step, _) in models.items()}
    for function, _ in runs.values():
        for _ in range(config.warmup):
            function().numpy()
    figures = interleaved_rounds(runs, config.steps, warmup=0, max_rounds=config.max_rounds)
    taken = config.warmup + int(figures["plain"]["steps"])
    final = {name: layer.admitted_ids for name, (layer, _, _) in models.items() if name != "plain"}
    del runs, models, batches
    release_memory()
    result: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "distinct_per_batch": distinct,
        "figures": figures,
        "ratios": {},
        "median_ratios": {},
        "timed": {},
        "stream": {},
        "counts_agree": {},
    }
    for name in MODELS[1:]:
        for key, figure in (("ratios", "step_ms"), ("median_ratios", "median_step_ms")):
            result[key][f"{name}_over_plain"] = figures[name][figure] / figures["plain"][figure]
        admission = admissions[name]
        assert admission is not None
        spans, admitted = count_admissions(
            admission, config, candidates, stream[:taken], config.warmup
        )
        result["timed"][name], result["stream"][name] = spans["timed"], spans["stream"]
        result["counts_agree"][name] = bool(np.array_equal(admitted, final[name]))
    return result


# -- the report ------------------------------------------------------------------------------


def _setting_lines(result: dict[str, Any]) -> list[str]:
    config = result["config"]
    candidates = (
        "every row"
        if config["permitted_fraction"] >= 1.0
        else f"{config['permitted_fraction']:g} of the rows"
    )
    steps = result["figures"]["plain"]["steps"]
    return [
        f"-- row admission: training step, V={config['vocab']:,} x D={config['width']}, "
        f"{config['batch']} x {config['ids_per_sample']} ids, {config['optimizer']}; "
        f"Zipf(a={config['zipf_exponent']:g}) ids, seed {config['seed']}",
        f"  candidates: {candidates}; {result['distinct_per_batch']:,.0f} distinct candidate "
        f"ids a batch (mean); each model: {config['warmup']} warm-up + {steps} timed steps",
        "  plain:     PartialEmbedding, no admission",
        f"  admitting: RowAdmission(min_count={config['min_count']}), no capacity",
        f"  evicting:  RowAdmission(min_count={config['min_count']}, "
        f"capacity={config['capacity']:,}, eviction={config['eviction']!r})",
    ]


def report(result: dict[str, Any]) -> str:
    """``measure_admission``'s result (or the same read from JSON) as text."""
    lines = _setting_lines(result)
    figures = result["figures"]
    lines.append(f"  {'ms a step':<12}{'best':>9}{'median':>9}{'rounds':>8}")
    for name in MODELS:
        figure = figures[name]
        lines.append(
            f"  {name:<12}{figure['step_ms']:>9.3f}{figure['median_step_ms']:>9.3f}"
            f"{figure['rounds']:>8}"
        )
    for name in MODELS[1:]:
        lines.append(
            f"  {name} / plain: {result['ratios'][f'{name}_over_plain']:.2f} "
            f"(medians {result['median_ratios'][f'{name}_over_plain']:.2f})"
        )
    lines.append(
        f"  {'rows':<16}{'admitted':>10}{'evicted':>10}{'steps that evicted':>20}"
        f"{'admitted at the end':>21}{'most at once':>14}"
    )
    for span in ("timed", "stream"):
        for name in MODELS[1:]:
            counts = result[span][name]
            tail = ""
            if span == "stream":
                tail = f"{counts['admitted_at_end']:>21,}{counts['most_admitted']:>14,}"
            evicting = f"{counts['steps_that_evicted']:,} of {counts['steps']:,}"
            lines.append(
                f"  {name:<10}{span:<6}{counts['admissions']:>10,}"
                f"{counts['evictions']:>10,}{evicting:>20}{tail}"
            )
    agree = ", ".join(
        f"{name} {'yes' if same else 'NO'}" for name, same in result["counts_agree"].items()
    )
    lines.append(
        "  (timed: the timed steps; stream: warm-up and timed. Counted untimed, from the "
        "admitted set after each batch of a one-column layer fed the same stream; its "
        f"final admitted rows are the timed model's: {agree})"
    )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    defaults = AdmissionConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --training --admission",
        description=__doc__.split("\n\n")[0],
    )
    for field in dataclasses.fields(AdmissionConfig):
        if field.name in ("capacity", "eviction", "optimizer"):
            continue
        default = getattr(defaults, field.name)
        parser.add_argument(
            "--" + field.name.replace("_", "-"), type=type(default), default=default
        )
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="rows the evicting model admits at once (default: a quarter above the mean "
        "distinct candidate ids of a batch)",
    )
    parser.add_argument("--eviction", choices=["lfu", "lru"], default=defaults.eviction)
    parser.add_argument(
        "--optimizer",
        choices=list(RULES),
        default=defaults.optimizer,
        help="the rule inside MaskedOptimizer (default: %(default)s)",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line entry point: one measurement, printed; returns its figures."""
    settings = vars(_parser().parse_args(list(sys.argv[1:] if argv is None else argv)))
    json_path = settings.pop("json")
    result = measure_admission(AdmissionConfig(**settings))
    print(report(result))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
