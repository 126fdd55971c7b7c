"""Version of this package and the TensorFlow and Keras releases it needs.

``setup.py`` executes this file to read the pins, so it imports nothing at
module level.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The op library is compiled against one TensorFlow minor release and loads
#: only into that one.
REQUIRED_TENSORFLOW = "2.21"

#: The Keras minor release line the package is developed and benchmarked on
#: (CI's main test run, ``build_tools/requirements-ci.txt``).
TESTED_KERAS = "3.15"

#: Every Keras line CI runs the Keras-touching tests on.
TESTED_KERAS_LINES = ("3.13", "3.14", "3.15")

#: The oldest Keras that TensorFlow 2.21 accepts (its own requirement): the
#: package imports on it and on every later 3.x release. Whether a release
#: has the private members the layers and the optimizer rely on is decided
#: at construction by ``_internal/framework_private.py``'s checked list, with
#: one error naming every missing member, not by the version number.
MIN_KERAS = "3.12"


def _major_minor(version: str) -> tuple[int, ...] | None:
    """``(major, minor)`` of a release string such as ``3.15.1.dev0``, or None."""
    parts = version.split(".")[:2]
    if len(parts) < 2 or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def on_release_line(installed: str, line: str) -> bool:
    """Whether release ``installed`` (``2.21.3``) is on minor line ``line`` (``2.21``)."""
    return _major_minor(installed) is not None and _major_minor(installed) == _major_minor(line)


def is_tested_keras(installed: str) -> bool:
    """Whether Keras release ``installed`` is on one of ``TESTED_KERAS_LINES``."""
    return any(on_release_line(installed, line) for line in TESTED_KERAS_LINES)


def check_keras_version(installed: str | None = None) -> None:
    """Raises KerasVersionError for a Keras that TensorFlow 2.21 itself refuses.

    Any Keras 3 from ``MIN_KERAS`` on imports, tested or not: a release that
    lacks a private member the package needs fails at construction, naming
    it (``_internal/framework_private.py``).

    Args:
      installed: a Keras release string; by default ``keras.version()`` of
        the installed Keras.

    Raises:
      KerasVersionError: naming the installed release and the accepted range.
    """
    # Imported here: setup.py runs this file where Keras may be absent.
    if installed is None:
        import keras

        installed = str(keras.version())
    version = _major_minor(installed)
    minimum = _major_minor(MIN_KERAS)
    if version is not None and minimum is not None and version[0] == 3 and version >= minimum:
        return
    from partial_embedding.errors import KerasVersionError

    raise KerasVersionError(
        f"partial_embedding needs Keras 3 from {MIN_KERAS} on (as TensorFlow "
        f"{REQUIRED_TENSORFLOW} does), and the installed Keras is {installed}; it is "
        f"tested on Keras {', '.join(TESTED_KERAS_LINES)}. Install one with "
        f"'pip install \"keras=={TESTED_KERAS}.*\"'."
    )
