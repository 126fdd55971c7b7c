"""Demos: ``python -m partial_embedding.demo [--lm|--keras-hub]``.

Without ``--lm``: new words next to pretrained word vectors in a sentiment
classifier, every pretrained row proven bit-identical after training
(``partial_embedding.demo._sentiment``, data in ``demo._data``, training in
``demo._training``). With ``--lm``: new tokens in a tied language model
(``partial_embedding.demo._lm``). With ``--keras-hub`` (needs the extra): new
words for a keras-hub causal LM, merged into a preset that plain keras-hub
loads (``partial_embedding.demo._keras_hub``). ``--help`` (with ``--lm``: ``--lm --help``)
lists each demo's flags.

A runnable tool, not part of the library's API: ``main`` is its one public
name, and the modules below it are private (their names start with ``_``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo the arguments choose; returns its exit status.

    Args:
        argv: The command line after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 when every check passed, 1 when one failed, 2 when the data are missing.
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    if "--keras-hub" in arguments:
        from partial_embedding.demo import _keras_hub as keras_hub

        return keras_hub.main(arguments)
    if "--lm" in arguments:
        from partial_embedding.demo import _lm as lm

        return lm.main(arguments)
    from partial_embedding.demo import _sentiment as sentiment

    return sentiment.main(arguments)
