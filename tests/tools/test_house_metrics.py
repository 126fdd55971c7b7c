"""build_tools/house_metrics.py: the circles it holds the tree to none of,
found in a small tree made here, and none in this checkout."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "build_tools" / "house_metrics.py"
if not SCRIPT.is_file():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("house_metrics", SCRIPT)
assert _spec is not None and _spec.loader is not None
metrics = importlib.util.module_from_spec(_spec)
sys.modules["house_metrics"] = metrics
_spec.loader.exec_module(metrics)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _write(
        tmp_path,
        {
            "python/partial_embedding/__init__.py": "from partial_embedding import a\n",
            # a -> b -> c -> a (c imports a inside a function: still a circle)
            "python/partial_embedding/a.py": '"""A."""\nfrom partial_embedding import b\n',
            "python/partial_embedding/b.py": "from . import c\n",
            "python/partial_embedding/c.py": "def f():\n    import partial_embedding.a\n",
            "python/partial_embedding/_private.py": "import partial_embedding.a\n",
            "python/partial_embedding/bench/__init__.py": "",
            "python/partial_embedding/bench/_tool.py": "",
            # x.cc/x.h -> y.h -> x.h; z.cc includes its own header only.
            "cc/x.h": '#include "cc/y.h"\n',
            "cc/x.cc": '#include "cc/x.h"\n',
            "cc/y.h": '#include "cc/x.h"\n',
            "cc/z.cc": '#include "cc/z.h"\n#include "cc/x.h"\n',
            "cc/z.h": "",
        },
    )
    return tmp_path


def test_circles_are_found_in_both_graphs(tree: Path) -> None:
    modules = metrics.module_files(tree)
    python = metrics.cycles(metrics.import_graph(modules))
    assert python == [["partial_embedding.a", "partial_embedding.b", "partial_embedding.c"]]
    assert metrics.cycles(metrics.include_graph(tree)) == [["cc/x", "cc/y"]]
    assert metrics.public_modules(modules) == [
        "partial_embedding",
        "partial_embedding.a",
        "partial_embedding.b",
        "partial_embedding.bench",
        "partial_embedding.c",
    ]
    assert metrics.main([str(tree), "--check"]) == 1


def test_breaking_the_circles_passes_the_check(tree: Path) -> None:
    _write(tree, {"python/partial_embedding/c.py": "", "cc/y.h": ""})
    assert metrics.main([str(tree), "--check"]) == 0


def test_this_checkout_has_no_circles() -> None:
    modules = metrics.module_files(ROOT)
    assert metrics.cycles(metrics.import_graph(modules)) == []
    assert metrics.cycles(metrics.include_graph(ROOT)) == []
