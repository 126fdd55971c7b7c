"""The README's table of public modules is the truth: every module it names
exports exactly the names it lists, each importable from there, and every
public module of the package is in the table."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import partial_embedding

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(partial_embedding[\w.]*)` \|[^|]*\| (.+) \|$", re.M)


def _readme_table() -> dict[str, set[str]]:
    """Module name -> the names its README row lists."""
    rows = {}
    for module, exports in _ROW.findall(README.read_text(encoding="utf-8")):
        rows[module] = set(re.findall(r"`([\w.]+)`", exports))
    return rows


def _public_modules() -> set[str]:
    """The package and every module below it whose path has no private part."""
    names = {partial_embedding.__name__}
    prefix = partial_embedding.__name__ + "."
    for info in pkgutil.walk_packages(partial_embedding.__path__, prefix):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.add(info.name)
    return names


def test_readme_has_a_row_per_public_module() -> None:
    table = _readme_table()
    assert table, "README.md: no table of public modules found"
    assert set(table) == _public_modules(), (
        f"README.md lists {sorted(set(table) - _public_modules())} that are not public modules "
        f"and misses {sorted(_public_modules() - set(table))}"
    )


@pytest.mark.parametrize("module_name", sorted(_readme_table()))
def test_every_listed_name_imports_from_where_the_readme_says(module_name: str) -> None:
    listed = _readme_table()[module_name]
    module = importlib.import_module(module_name)
    exported = set(getattr(module, "__all__", ()))
    assert exported == listed, (
        f"{module_name}.__all__ has {sorted(exported - listed)} that README.md does not list "
        f"and lacks {sorted(listed - exported)}"
    )
    for name in sorted(exported):
        namespace: dict[str, object] = {}
        exec(f"from {module_name} import {name}", namespace)
        assert namespace[name] is getattr(module, name)
