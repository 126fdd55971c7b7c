"""Finds and loads the compiled op library, once.

``import partial_embedding`` loads it (about 15 ms) so that the op is
registered with TensorFlow before anything needs it by name: a SavedModel or
GraphDef that uses the op loads with ``tf.saved_model.load`` in a process that
only imported the package. Where the library cannot load, the import still
succeeds and the first call of an op raises the explanatory error.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType

import tensorflow as tf

from partial_embedding._build_info import warn_if_gpu_without_cuda_kernels
from partial_embedding._version import REQUIRED_TENSORFLOW, on_release_line
from partial_embedding.errors import TensorFlowVersionError

_LIBRARY_FILE = "_partial_embedding_ops.so"
_lock = threading.Lock()
_library: ModuleType | None = None


def _check_tensorflow_version(installed: str) -> None:
    if not on_release_line(installed, REQUIRED_TENSORFLOW):
        raise TensorFlowVersionError(
            f"partial_embedding's op library was built for TensorFlow "
            f"{REQUIRED_TENSORFLOW}.x and cannot load into the installed "
            f"TensorFlow {installed}. Install it with "
            f"'pip install \"tensorflow=={REQUIRED_TENSORFLOW}.*\"', or rebuild "
            f"this package against TensorFlow {installed}."
        )


def library_path() -> str:
    """Returns the path of the op library inside the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY_FILE)


def load_ops() -> ModuleType:
    """Loads the op library (once) and returns its generated op wrappers.

    Raises:
      TensorFlowVersionError: the installed TensorFlow is not the one the
        library was built for.
      ImportError: the library was not built (the package was not installed
        with ``pip install``).
    """
    global _library
    with _lock:
        if _library is None:
            _check_tensorflow_version(tf.__version__)
            path = library_path()
            if not os.path.exists(path):
                raise ImportError(
                    f"partial_embedding's op library is missing at {path}. Build "
                    "and install the package with 'pip install .' from the "
                    "source tree."
                )
            _library = tf.load_op_library(path)
        return _library


def register_ops_on_import() -> None:
    """Loads the library if it can; leaves the error to the first op call.

    Where it loads but was built without CUDA while TensorFlow sees a GPU,
    warns once, naming how to build it with CUDA (see
    ``_build_info.warn_if_gpu_without_cuda_kernels``).
    """
    try:
        load_ops()
    except (ImportError, TensorFlowVersionError, tf.errors.NotFoundError):
        return
    warn_if_gpu_without_cuda_kernels()
