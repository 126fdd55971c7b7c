"""Demos: ``python -m partial_embedding.demo [--lm|--keras-hub]``.

Without ``--lm``: new words next to pretrained word vectors in a sentiment
classifier, every pretrained row proven bit-identical after training
(``partial_embedding.demo.sentiment``, data in ``demo.data``, training in
``demo.training``). With ``--lm``: new tokens in a tied language model
(``partial_embedding.demo.lm``). With ``--keras-hub`` (needs the extra): new
words for a keras-hub causal LM, merged into a preset that plain keras-hub
loads (``partial_embedding.demo.keras_hub``). ``--help`` (with ``--lm``: ``--lm --help``)
lists each demo's flags.
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
        from partial_embedding.demo import keras_hub

        return keras_hub.main(arguments)
    if "--lm" in arguments:
        from partial_embedding.demo import lm

        return lm.main(arguments)
    from partial_embedding.demo import sentiment

    return sentiment.main(arguments)
