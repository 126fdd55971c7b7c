"""The table of public modules in docs/layout.md is the truth: every module it
names exports exactly the names it lists, each importable from there, and every
public module of the package is in the table."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import partial_embedding

LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "layout.md"
MODULES_SECTION = "## The public modules"
COMMANDS_SECTION = "## The commands"
_ROW = re.compile(r"^\| `(partial_embedding[\w.]*)` \|[^|]*\| (.+) \|$", re.M)


def _section(heading: str) -> str:
    """The text of docs/layout.md under ``heading``, up to the next heading of its level."""
    text = LAYOUT.read_text(encoding="utf-8")
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _layout_table(heading: str = MODULES_SECTION) -> dict[str, set[str]]:
    """Module name -> the names its row lists, in the table under ``heading``."""
    rows = {}
    for module, exports in _ROW.findall(_section(heading)):
        rows[module] = set(re.findall(r"`([\w.]+)`", exports))
    return rows


def _all_rows() -> dict[str, set[str]]:
    """The library's public modules and the two commands, each from its own table."""
    return {**_layout_table(MODULES_SECTION), **_layout_table(COMMANDS_SECTION)}


def _public_modules() -> set[str]:
    """The package and every module below it whose path has no private part."""
    names = {partial_embedding.__name__}
    prefix = partial_embedding.__name__ + "."
    for info in pkgutil.walk_packages(partial_embedding.__path__, prefix):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.add(info.name)
    return names


def test_layout_has_a_row_per_public_module() -> None:
    assert _layout_table(), f"{LAYOUT.name}: no table of public modules under {MODULES_SECTION!r}"
    table = _all_rows()
    public = _public_modules()
    undocumented = public - set(table)
    assert not undocumented, f"{LAYOUT.name} misses the public modules {sorted(undocumented)}"
    missing = set(table) - public
    assert not missing, f"{LAYOUT.name} lists {sorted(missing)}, which are not public modules"


def test_the_tools_are_commands_not_api():
    # bench and demo are runnable packages: their helpers live in private
    # modules, so the walk finds the two packages alone, each exporting main.
    tools = {name for name in _public_modules() if name.split(".")[1:2] in (["bench"], ["demo"])}
    assert tools == {"partial_embedding.bench", "partial_embedding.demo"}
    # The library's table lists the library only; the tools have their own.
    assert set(_layout_table(COMMANDS_SECTION)) == tools
    assert not tools & set(_layout_table(MODULES_SECTION))
    for name in tools:
        assert importlib.import_module(name).__all__ == ["main"]


@pytest.mark.parametrize("module_name", sorted(_all_rows()))
def test_every_listed_name_imports_from_where_the_layout_says(module_name: str) -> None:
    listed = _all_rows()[module_name]
    module = importlib.import_module(module_name)
    exported = set(getattr(module, "__all__", ()))
    assert exported == listed, (
        f"{module_name}.__all__ has {sorted(exported - listed)} that {LAYOUT.name} does not list "
        f"and lacks {sorted(listed - exported)}"
    )
    for name in sorted(exported):
        namespace: dict[str, object] = {}
        exec(f"from {module_name} import {name}", namespace)
        assert namespace[name] is getattr(module, name)
