"""Version of this package and the TensorFlow and Keras releases it needs.

``setup.py`` executes this file to read the pins, so it imports nothing at
module level.
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The op library is compiled against one TensorFlow minor release and loads
#: only into that one.
REQUIRED_TENSORFLOW = "2.21"

#: The Keras minor release line MaskedOptimizer and PartialEmbedding are
#: tested with. They rely on private Keras members, so another line (even one
#: that TensorFlow accepts) is refused at import; the wheel pins it too.
TESTED_KERAS = "3.15"


def _major_minor(version: str) -> tuple[int, ...] | None:
    """``(major, minor)`` of a release string such as ``3.15.1.dev0``, or None."""
    parts = version.split(".")[:2]
    if len(parts) < 2 or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def on_release_line(installed: str, line: str) -> bool:
    """Whether release ``installed`` (``2.21.3``) is on minor line ``line`` (``2.21``)."""
    return _major_minor(installed) is not None and _major_minor(installed) == _major_minor(line)


def check_keras_version(installed: str | None = None) -> None:
    """Raises KerasVersionError unless the Keras release is on the tested line.

    Args:
      installed: a Keras release string; by default ``keras.version()`` of
        the installed Keras.

    Raises:
      KerasVersionError: naming the installed and the tested release.
    """
    # Imported here: setup.py runs this file where Keras may be absent.
    if installed is None:
        import keras

        installed = str(keras.version())
    if on_release_line(installed, TESTED_KERAS):
        return
    from partial_embedding.errors import KerasVersionError

    raise KerasVersionError(
        f"partial_embedding is tested with Keras {TESTED_KERAS}.x only (it relies on "
        f"private Keras members), and the installed Keras is {installed}. Install a "
        f"tested release with 'pip install \"keras=={TESTED_KERAS}.*\"'."
    )
