"""The table of public modules in docs/layout.md is the truth: every module it
names exports exactly the names it lists, each importable from there, and every
public module of the package is in the table or among the moved module paths
listed on the same page."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import partial_embedding

LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "layout.md"
MODULES_SECTION = "## The public modules"
MOVED_SECTION = "## Moved modules"
_ROW = re.compile(r"^\| `(partial_embedding[\w.]*)` \|[^|]*\| (.+) \|$", re.M)
_MOVED_ROW = re.compile(r"^\| `(partial_embedding[\w.]*)` \| `(partial_embedding[\w.]*)` \|", re.M)

# Rows that describe the layout of issue #23 before this tree has it: the
# modules the restructuring (in other branches) creates or whose exports it
# changes. Such a row may name a module that does not exist yet or exports other
# names; once the module matches its row, the test below fails until the module
# is taken off this set, so the set only shrinks. Empty once #23 is merged.
AWAITING_RESTRUCTURING: frozenset[str] = frozenset()


def _section(heading: str) -> str:
    """The text of docs/layout.md under ``heading``, up to the next heading of its level."""
    text = LAYOUT.read_text(encoding="utf-8")
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _layout_table() -> dict[str, set[str]]:
    """Module name -> the names its row lists."""
    rows = {}
    for module, exports in _ROW.findall(_section(MODULES_SECTION)):
        rows[module] = set(re.findall(r"`([\w.]+)`", exports))
    return rows


def _moved_modules() -> dict[str, str]:
    """Old module path -> the module that holds its code now."""
    return dict(_MOVED_ROW.findall(_section(MOVED_SECTION)))


def _public_modules() -> set[str]:
    """The package and every module below it whose path has no private part."""
    names = {partial_embedding.__name__}
    prefix = partial_embedding.__name__ + "."
    for info in pkgutil.walk_packages(partial_embedding.__path__, prefix):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.add(info.name)
    return names


def test_layout_has_a_row_per_public_module() -> None:
    table = _layout_table()
    assert table, f"{LAYOUT.name}: no table of public modules under {MODULES_SECTION!r}"
    public = _public_modules()
    undocumented = public - set(table) - set(_moved_modules())
    assert not undocumented, f"{LAYOUT.name} misses the public modules {sorted(undocumented)}"
    missing = set(table) - public - AWAITING_RESTRUCTURING
    assert not missing, f"{LAYOUT.name} lists {sorted(missing)}, which are not public modules"


def test_moved_modules_still_import() -> None:
    moved = _moved_modules()
    assert moved, f"{LAYOUT.name}: no table of moved modules under {MOVED_SECTION!r}"
    table = _layout_table()
    for old, new in sorted(moved.items()):
        assert new in table, f"{old} moved to {new}, which has no row in the module table"
        assert old not in table, f"{old} is listed both as moved and as a module"
        importlib.import_module(old)


@pytest.mark.parametrize("module_name", sorted(_layout_table()))
def test_every_listed_name_imports_from_where_the_layout_says(module_name: str) -> None:
    listed = _layout_table()[module_name]
    if module_name in AWAITING_RESTRUCTURING:
        _check_awaited(module_name, listed)
        return
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


def _check_awaited(module_name: str, listed: set[str]) -> None:
    """Skips a row the restructuring has not reached; fails once it has."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        pytest.skip(f"{module_name}: not in this tree yet (issue #23)")
    if set(getattr(module, "__all__", ())) != listed:
        pytest.skip(f"{module_name}: exports differ from its row until issue #23 is merged")
    pytest.fail(f"{module_name} now matches its row: take it off AWAITING_RESTRUCTURING")
