"""Runnable documentation: docstring examples and the README's Python blocks."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import partial_embedding

README = Path(__file__).resolve().parents[2] / "README.md"
# Compiled libraries: no Python docstrings to run.
NOT_DOCUMENTED = {"partial_embedding._kernels", "partial_embedding._partial_embedding_ops"}


def _modules() -> list[str]:
    """The package and every module below it, subpackages' modules included."""
    names = [partial_embedding.__name__]
    for info in pkgutil.walk_packages(partial_embedding.__path__, partial_embedding.__name__ + "."):
        if info.name not in NOT_DOCUMENTED:
            names.append(info.name)
    return names


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples_run(module_name: str) -> None:
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"


def _readme_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_public_api_has_examples() -> None:
    missing = []
    for name in partial_embedding.__all__:
        item = getattr(partial_embedding, name)
        is_exception = isinstance(item, type) and issubclass(item, BaseException)
        if callable(item) and not is_exception and ">>>" not in (item.__doc__ or ""):
            missing.append(name)
    assert not missing, f"public names without a >>> example: {missing}"


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_python_blocks_run(index: int, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = _readme_blocks()[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
