"""Benchmarks: ``python -m partial_embedding.bench [--quick|--full|--<benchmark>]``.

A runnable tool, not part of the library's API: ``main`` is its one public
name, and the modules below it are private (their names start with ``_``).

Without a choice of benchmark (``--quick``, ``--full`` or neither), the kernel
benchmark: ``masked_scatter_sub`` against TensorFlow's built-in updates, a
training step and the GPU section. ``--memory``, ``--training``, ``--lm``,
``--keras-hub`` and ``--keras-rs`` (each needs its extra), ``--gpu-step``, ``--gpu-host-table`` (a
table larger than the GPU with ``frozen_rows_on="host"``), ``--bags``, ``--int8`` and
``--versus-fbgemm`` (needs PyTorch and FBGEMM) run another benchmark instead,
and ``--training --admission`` the row-admission step (``bench._admission``);
the other flags are then that benchmark's own (``--memory --help`` lists them).
What each measures, and how to read it: docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# The flag that picks each benchmark other than the kernel one, and its module.
_BENCHMARKS = {
    "--memory": "_memory",
    "--training": "_training",
    "--lm": "_lm",
    "--keras-hub": "_keras_hub",
    "--keras-rs": "_keras_rs",
    "--gpu-step": "_gpu_step",
    "--gpu-host-table": "_gpu_host_table",
    "--bags": "_bags",
    "--int8": "_quantized",
    "--versus-fbgemm": "_versus_fbgemm",
}
#: A benchmark picked by a flag next to another: ``--training --admission``.
_SUB_BENCHMARKS = {("--training", "--admission"): "_admission"}


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark the arguments choose, with the rest of its flags.

    Args:
        argv: The command line after the program name (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: When more than one benchmark flag is given, ``--admission``
            without ``--training``, or a benchmark's own flags are wrong.

    >>> main(["--memory", "--help"])  # doctest: +SKIP
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    chosen = [flag for flag in _BENCHMARKS if flag in arguments]
    if len(chosen) > 1:
        raise SystemExit(
            f"partial_embedding.bench: choose one of {', '.join(_BENCHMARKS)}; got {chosen}"
        )
    name = _BENCHMARKS[chosen[0]] if chosen else "_kernels"
    for (flag, sub_flag), sub_name in _SUB_BENCHMARKS.items():
        if sub_flag not in arguments:
            continue
        if chosen != [flag]:
            raise SystemExit(f"partial_embedding.bench: {sub_flag} goes with {flag}")
        chosen, name = [flag, sub_flag], sub_name
    module = importlib.import_module(f"partial_embedding.bench.{name}")
    module.main([argument for argument in arguments if argument not in chosen])
