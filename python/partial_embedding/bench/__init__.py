"""Benchmarks: ``python -m partial_embedding.bench [--quick|--full|--<benchmark>]``.

Without a choice of benchmark (``--quick``, ``--full`` or neither), the kernel
benchmark: ``masked_scatter_sub`` against TensorFlow's built-in updates, a
training step and the GPU section (``partial_embedding.bench.kernels``).
``--memory``, ``--training`` and ``--lm`` run the memory benchmark
(``bench.memory``), the training-step benchmark alone (``bench.training``) or
the tied language-model benchmark (``bench.lm``) instead, and ``--keras-hub``
(needs the extra) adding tokens to a keras-hub model three ways
(``bench.keras_hub``); the other flags are
then that benchmark's own (``--memory --help`` lists them). The models the
benchmarks share live in ``bench.models``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["BENCHMARKS", "main"]

#: The flag that picks each benchmark other than the kernel one, and its module.
BENCHMARKS = {
    "--memory": "memory",
    "--training": "training",
    "--lm": "lm",
    "--keras-hub": "keras_hub",
    "--gpu-step": "gpu_step",
}


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark the arguments choose, with the rest of its flags.

    Args:
        argv: The command line after the program name (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: When more than one of ``--memory``, ``--training``,
            ``--lm`` and ``--keras-hub`` is given, or a benchmark's own flags are wrong.
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    chosen = [flag for flag in BENCHMARKS if flag in arguments]
    if len(chosen) > 1:
        raise SystemExit(
            f"partial_embedding.bench: choose one of {', '.join(BENCHMARKS)}; got {chosen}"
        )
    name = BENCHMARKS[chosen[0]] if chosen else "kernels"
    module = importlib.import_module(f"partial_embedding.bench.{name}")
    module.main([argument for argument in arguments if argument not in chosen])
