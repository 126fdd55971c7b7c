"""New words for a keras-hub causal LM: ``python -m partial_embedding.demo --keras-hub``.

Needs the ``keras-hub`` extra. A GPT-2 causal LM is built from a small config
(its random weights, fixed seed, stand in for ``from_preset``) with a
byte-pair tokenizer made here from a few letters and merges: nothing is
downloaded. The tokenizer splits domain words such as ``tensorflow`` into
single letters; :func:`partial_embedding.keras_hub.add_tokens` adds each as
one token, and ``fit`` with ``MaskedOptimizer(AdamW)`` trains only their rows
of the tied table. The demo then proves every other weight bit-identical,
writes the trained rows (``save_trained_rows``), merges them into a preset
(``merge_into_preset``) and loads that preset with plain keras-hub in a
subprocess that cannot import partial_embedding: same token ids, same table,
same hidden states, and logits bit-identical to the stock output projection
of the trained model.

:func:`run_demo` returns a :class:`KerasHubDemo`; :func:`report` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from typing import Any, TextIO

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

__all__ = ["DOMAIN_WORDS", "KerasHubDemo", "main", "parse_args", "report", "run_demo"]

#: The words the small tokenizer splits into letters and the demo adds as tokens.
DOMAIN_WORDS = ("tensorflow", "keras", "embedding", "optimizer")

#: The text trained on (and scored): every sentence holds domain words.
SENTENCES = (
    "the keras embedding trains the tensorflow optimizer",
    "the tensorflow embedding and the keras optimizer",
    "keras and tensorflow train the embedding",
    "the optimizer of the keras embedding",
)

_SEQUENCE_LENGTH = 24


def _tokenizer_vocabulary() -> tuple[dict[str, int], list[str]]:
    """A GPT-2 vocabulary of single letters and a few merges (``the``, `` the``)."""
    letters = [chr(code) for code in range(ord("a"), ord("z") + 1)]
    tokens = ["<|endoftext|>", "Ġ", *letters, "th", "the", "Ġthe"]
    return {token: index for index, token in enumerate(tokens)}, ["t h", "th e", "Ġ the"]


def build_causal_lm(seed: int) -> Any:
    """The "pretrained" GPT-2 causal LM (small config, random weights) and its tokenizer."""
    import keras
    import keras_hub

    vocabulary, merges = _tokenizer_vocabulary()
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=len(vocabulary),
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=32,
        dropout=0.0,
    )
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(
        tokenizer, sequence_length=_SEQUENCE_LENGTH
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor)


def _numpy(value: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))


def _scored_batch(model: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The sentences as the model's preprocessor makes them: inputs, next ids, weights."""
    inputs, targets, weights = model.preprocessor(list(SENTENCES))
    inputs = {name: _numpy(value) for name, value in inputs.items()}
    return inputs, _numpy(targets), _numpy(weights).astype(np.float64)


def _losses(model: Any, new_ids: np.ndarray) -> tuple[float, float]:
    """Mean next-token cross-entropy (float64) over every scored position, and
    over the positions whose next token is a new one."""
    inputs, targets, weights = _scored_batch(model)
    logits = _numpy(model(inputs)).astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    token_loss = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    new_weights = weights * np.isin(targets, new_ids)
    overall = float((token_loss * weights).sum() / weights.sum())
    return overall, float((token_loss * new_weights).sum() / new_weights.sum())


def _pieces_before(model: Any) -> dict[str, int]:
    """How many tokens the original tokenizer splits each domain word into."""
    tokenizer = model.preprocessor.tokenizer
    return {word: int(_numpy(tokenizer(word)).size) for word in DOMAIN_WORDS}


@dataclasses.dataclass(frozen=True)
class KerasHubDemo:
    """What one run of the demo showed.

    Attributes:
      vocabulary_before, vocabulary_after: Rows of the token table.
      new_ids: The rows ``add_tokens`` gave the domain words.
      pieces_before: Tokens each domain word was split into before.
      loss_before, loss_after: Mean next-token loss on ``SENTENCES``.
      new_token_loss_before, new_token_loss_after: The same over the
        positions whose next token is a domain word.
      frozen_rows_identical: Every old row of the table bit-identical.
      other_weights_identical: Every weight outside the table bit-identical.
      new_rows_moved: How many new rows training changed.
      rows_file, rows_file_bytes, preset_dir: What the demo wrote.
      token_ids_identical: The preset's tokenizer gives the same ids.
      table_identical, hidden_identical: Plain keras-hub's table and hidden
        states against the trained model's.
      logits_identical: Plain keras-hub's logits bit-identical to the stock
        output projection (hidden states times the table's transpose) of the
        trained model.
      max_logit_difference: Largest gap between plain keras-hub's logits and
        the trained model's own (its projection sums in another order).
    """

    vocabulary_before: int
    vocabulary_after: int
    new_ids: list[int]
    pieces_before: dict[str, int]
    loss_before: float
    loss_after: float
    new_token_loss_before: float
    new_token_loss_after: float
    frozen_rows_identical: bool
    other_weights_identical: bool
    new_rows_moved: int
    rows_file: str
    rows_file_bytes: int
    preset_dir: str
    token_ids_identical: bool
    table_identical: bool
    hidden_identical: bool
    logits_identical: bool
    max_logit_difference: float

    @property
    def passed(self) -> bool:
        """Loss fell, frozen weights held, and plain keras-hub reloaded the same model."""
        return (
            self.new_token_loss_after < self.new_token_loss_before
            and self.loss_after < self.loss_before
            and self.frozen_rows_identical
            and self.other_weights_identical
            and self.new_rows_moved == len(self.new_ids)
            and self.token_ids_identical
            and self.table_identical
            and self.hidden_identical
            and self.logits_identical
        )


def _train(model: Any, steps: int) -> Any:
    """``steps`` steps of ``fit`` with ``MaskedOptimizer(AdamW)``; the optimizer."""
    import keras

    import partial_embedding as pe

    optimizer = pe.MaskedOptimizer(keras.optimizers.AdamW(learning_rate=0.05, weight_decay=0.01))
    model.compile(optimizer=optimizer, jit_compile=False)
    texts = list(SENTENCES) * steps
    model.fit(texts, batch_size=len(SENTENCES), epochs=1, shuffle=False, verbose=0)
    return optimizer


def _weights_held(model: Any, before: list[np.ndarray], old_rows: int) -> tuple[bool, bool, int]:
    """Old table rows identical, other weights identical, new rows moved."""
    table_held, others_held, moved = True, True, 0
    for weight, old in zip(model.weights, before, strict=True):
        new = _numpy(weight)
        if weight.path.startswith("token_embedding/") and "mask" not in weight.path:
            table_held &= bool(np.array_equal(new[:old_rows], old[:old_rows]))
            moved += int(np.any(new[old_rows:] != old[old_rows:], axis=1).sum())
        else:
            others_held &= bool(np.array_equal(new, old))
    return table_held, others_held, moved


# Runs where partial_embedding cannot be imported: loads the preset with plain
# keras-hub, tokenizes the sentences with the preset's own tokenizer and saves
# the ids, table, hidden states and logits.
_PLAIN_KERAS_HUB = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "partial_embedding":
                raise ImportError("partial_embedding is blocked in this process")
    sys.meta_path.insert(0, Blocker())
    import numpy as np, keras, keras_hub
    preset, sentences, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    model = keras_hub.models.GPT2CausalLM.from_preset(preset)
    assert type(model.backbone.token_embedding) is keras.layers.ReversibleEmbedding
    inputs = model.preprocessor(sentences)[0]
    np.savez(out, token_ids=keras.ops.convert_to_numpy(inputs["token_ids"]),
             table=keras.ops.convert_to_numpy(model.backbone.token_embedding.embeddings),
             hidden=keras.ops.convert_to_numpy(model.backbone(inputs)),
             logits=keras.ops.convert_to_numpy(model(inputs)))
    assert "partial_embedding" not in sys.modules
    """
)


def _load_in_plain_keras_hub(preset_dir: str, work_dir: str) -> dict[str, np.ndarray]:
    """Runs ``_PLAIN_KERAS_HUB`` in a fresh interpreter; its arrays."""
    script = os.path.join(work_dir, "plain_keras_hub.py")
    with open(script, "w") as file:
        file.write(_PLAIN_KERAS_HUB)
    out = os.path.join(work_dir, "plain_keras_hub.npz")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONPATH", None)
    command = [sys.executable, script, preset_dir, json.dumps(list(SENTENCES)), out]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"plain keras-hub could not load {preset_dir}:\n{result.stderr[-3000:]}")
    with np.load(out) as arrays:
        return {name: arrays[name] for name in arrays.files}


def _compare_with_plain(model: Any, plain: dict[str, np.ndarray]) -> dict[str, Any]:
    """Plain keras-hub's arrays against the trained model's."""
    import keras

    inputs, _, _ = _scored_batch(model)
    table = model.backbone.token_embedding.embeddings
    hidden = model.backbone(inputs)
    # The stock ReversibleEmbedding's projection, on the trained model's values.
    stock_logits = _numpy(keras.ops.matmul(hidden, keras.ops.transpose(table)))
    own_logits = _numpy(model(inputs))
    return {
        "token_ids_identical": bool(np.array_equal(plain["token_ids"], inputs["token_ids"])),
        "table_identical": bool(np.array_equal(plain["table"], _numpy(table))),
        "hidden_identical": bool(np.array_equal(plain["hidden"], _numpy(hidden))),
        "logits_identical": bool(np.array_equal(plain["logits"], stock_logits)),
        "max_logit_difference": float(np.max(np.abs(plain["logits"] - own_logits))),
    }


def run_demo(steps: int = 40, seed: int = 0, out: str | None = None) -> KerasHubDemo:
    """Adds ``DOMAIN_WORDS`` to a small GPT-2 causal LM, trains, ships and reloads them.

    Args:
      steps: Training steps (one batch of ``SENTENCES`` each).
      seed: Seed of the "pretrained" weights.
      out: Directory for the rows file and the preset (a temporary one if None).

    Returns:
      What the run showed; ``passed`` says whether every check held.
    """
    import partial_embedding as pe
    import partial_embedding.keras_hub as pek

    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}")
    out = out or tempfile.mkdtemp(prefix="pe_keras_hub_demo_")
    os.makedirs(out, exist_ok=True)
    original = build_causal_lm(seed)
    added = pek.add_tokens(original, list(DOMAIN_WORDS), init="subword_mean", seed=seed)
    model, old_rows = added.model, original.backbone.token_embedding.input_dim
    loss_before, new_loss_before = _losses(model, added.new_ids)
    before = [_numpy(weight) for weight in model.weights]
    optimizer = _train(model, steps)
    loss_after, new_loss_after = _losses(model, added.new_ids)
    table_held, others_held, moved = _weights_held(model, before, old_rows)
    rows_file = os.path.join(out, "new_rows.safetensors")
    pe.save_trained_rows(rows_file, model.backbone.token_embedding, optimizer=optimizer)
    preset_dir = pek.merge_into_preset(model, rows_file, os.path.join(out, "preset"))
    plain = _load_in_plain_keras_hub(preset_dir, out)
    return KerasHubDemo(
        vocabulary_before=old_rows,
        vocabulary_after=model.backbone.token_embedding.input_dim,
        new_ids=[int(i) for i in added.new_ids],
        pieces_before=_pieces_before(original),
        loss_before=loss_before,
        loss_after=loss_after,
        new_token_loss_before=new_loss_before,
        new_token_loss_after=new_loss_after,
        frozen_rows_identical=table_held,
        other_weights_identical=others_held,
        new_rows_moved=moved,
        rows_file=rows_file,
        rows_file_bytes=os.path.getsize(rows_file),
        preset_dir=preset_dir,
        **_compare_with_plain(model, plain),
    )


def report(result: KerasHubDemo, stream: TextIO = sys.stdout) -> None:
    """Prints what the demo showed, one check a line."""

    def mark(ok: bool) -> str:
        return "ok" if ok else "FAILED"

    write = stream.write
    pieces = ", ".join(f"{word} -> {n}" for word, n in result.pieces_before.items())
    write(f"tokens the small tokenizer split each word into: {pieces}\n")
    write(
        f"added {len(result.new_ids)} tokens: table {result.vocabulary_before} -> "
        f"{result.vocabulary_after} rows, new ids {result.new_ids}\n"
    )
    write(f"loss on the text:       {result.loss_before:.4f} -> {result.loss_after:.4f}\n")
    write(
        f"loss on the new tokens: {result.new_token_loss_before:.4f} -> "
        f"{result.new_token_loss_after:.4f}\n"
    )
    write(f"old rows bit-identical:      {mark(result.frozen_rows_identical)}\n")
    write(f"other weights bit-identical: {mark(result.other_weights_identical)}\n")
    write(f"new rows moved: {result.new_rows_moved} of {len(result.new_ids)}\n")
    write(f"rows file: {result.rows_file} ({result.rows_file_bytes} bytes)\n")
    write(f"merged preset: {result.preset_dir}\n")
    write("plain keras-hub (partial_embedding blocked) loaded it:\n")
    write(f"  token ids identical:     {mark(result.token_ids_identical)}\n")
    write(f"  table identical:         {mark(result.table_identical)}\n")
    write(f"  hidden states identical: {mark(result.hidden_identical)}\n")
    write(f"  logits identical:        {mark(result.logits_identical)}\n")
    write(f"  largest gap to the partial model's own logits: {result.max_logit_difference:.2e}\n")
    write("PASSED\n" if result.passed else "FAILED\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's flags (``--keras-hub`` itself is accepted and ignored)."""
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.demo --keras-hub",
        description="New words for a small keras-hub GPT-2: add, train, ship, reload.",
    )
    parser.add_argument("--keras-hub", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    parser.add_argument("--out", default=None, help="directory for the rows file and preset")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo from the command line; 0 when every check passed."""
    args = parse_args(argv)
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        sys.stderr.write('needs keras-hub: pip install "tf-partial-embedding[keras-hub]"\n')
        return 2
    result = run_demo(steps=args.steps, seed=args.seed, out=args.out)
    report(result)
    return 0 if result.passed else 1
