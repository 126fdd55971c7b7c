"""The build backend: setuptools' own, asking for TensorFlow and CMake only when it compiles.

CMake and TensorFlow's headers are needed only to compile the op libraries. A
checkout whose build is kept (``build_tools/build_cache.py``: the same sources,
Python, compiler and settings) compiles nothing, so pip's isolated build
environment can do without them: installing TensorFlow there alone took 31 s
of a 2 min 19 s second install on the 2-core machine. Everything else is
setuptools' ``build_meta``, as setuptools documents for in-tree backends.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the rest of the backend is setuptools')

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_cache  # noqa: E402

#: What a build that compiles needs besides setuptools, wheel and pybind11.
COMPILE_REQUIREMENTS = ["cmake>=3.18", "tensorflow>=2.21,<2.22"]


def _compile_requirements() -> list[str]:
    try:
        import pybind11  # noqa: F401
    except ImportError:
        with_kernel_module = False
    else:
        with_kernel_module = True
    if build_cache.BuildCache(ROOT, with_kernel_module).available():
        return []
    return list(COMPILE_REQUIREMENTS)


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return _setuptools.get_requires_for_build_wheel(config_settings) + _compile_requirements()


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return _setuptools.get_requires_for_build_editable(config_settings) + _compile_requirements()
