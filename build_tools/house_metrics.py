#!/usr/bin/env python3
"""How heavy the house is: the figures issue #43 asks for, from a source tree.

    python build_tools/house_metrics.py [ROOT] [--duplicates] [--json]

Prints, for the tree at ROOT (default: this checkout):

- lines per room: the library (the package without ``bench/`` and ``demo/``),
  the bench, the demo, ``build_tools/``, ``cc/`` and ``tests/`` (every line of
  the files git tracks there, or of every file when ROOT is no checkout);
- the public modules: those the package walk finds with no private part in
  their dotted path (what ``tests/package/test_layout.py`` holds the docs'
  table to), read from the files, nothing imported;
- the longest public docstring: of a public class, function or method in a
  public module;
- circles: cycles in the package's import graph (every ``import`` of one of
  its modules, at any depth of the file) and in ``cc/``'s ``#include`` graph
  between source files, a ``.cc`` and its ``.h`` counted as one node;
- with ``--duplicates``, the pair count of the ``duplicates`` command over ROOT
  where that command is on PATH.

Exits 1 where it finds a circle: ``--check`` prints only the circles, which
``check.sh --static`` (and so CI) holds the tree to none of.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path("python") / "partial_embedding"
SOURCE_SUFFIXES = (".py", ".cc", ".h", ".cu", ".cuh", ".sh", ".cmake", ".txt", ".c")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"(cc/[^"]+)"', re.M)


def tracked_files(root: Path, folder: str) -> list[Path]:
    """The files below ``folder`` that git tracks (every file outside a checkout)."""
    base = root / folder
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--", folder],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
        return [root / name for name in listed if name and (root / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [path for path in base.rglob("*") if path.is_file()]


def _lines(paths: Iterable[Path]) -> int:
    return sum(
        len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        for path in paths
        if path.suffix in SOURCE_SUFFIXES
    )


def lines_per_room(root: Path) -> dict[str, int]:
    package = tracked_files(root, PACKAGE.as_posix())
    tools = ("bench", "demo")

    def room(name: str) -> list[Path]:
        prefix = (root / PACKAGE / name).as_posix()
        # The tools' package and the old top-level shims (bench_lm.py, demo_lm.py).
        return [
            p
            for p in package
            if p.as_posix().startswith(prefix + "/")
            or (p.parent == root / PACKAGE and p.name.startswith(name + "_"))
        ]

    tool_files = {path for name in tools for path in room(name)}
    return {
        "library": _lines(p for p in package if p not in tool_files),
        "bench": _lines(room("bench")),
        "demo": _lines(room("demo")),
        "build_tools": _lines(tracked_files(root, "build_tools")),
        "cc": _lines(tracked_files(root, "cc")),
        "tests": _lines(tracked_files(root, "tests")),
    }


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root / PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def public_modules(modules: dict[str, Path]) -> list[str]:
    return sorted(
        name for name in modules if not any(part.startswith("_") for part in name.split("."))
    )


def _public_docstrings(name: str, tree: ast.Module) -> Iterable[tuple[str, int]]:
    def walk(body: list[ast.stmt], prefix: str) -> Iterable[tuple[str, int]]:
        for node in body:
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_") and not (
                node.name.startswith("__") and node.name.endswith("__")
            ):
                continue
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield f"{prefix}{node.name}", len(doc.splitlines())
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(tree.body, f"{name}.")


def _exported_names(tree: ast.Module) -> set[str]:
    """The names a module's ``__all__`` lists (a literal list or tuple)."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


def longest_public_docstrings(modules: dict[str, Path], count: int = 3) -> list[tuple[str, int]]:
    """The longest docstrings of what users see: every public def of a public
    module, and the classes and functions a private module defines that a
    public module exports (``MaskedOptimizer`` lives in a private module)."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    public = public_modules(modules)
    exported = set().union(*(_exported_names(trees[name]) for name in public))
    found = []
    for name, tree in trees.items():
        if name in public:
            found += _public_docstrings(name, tree)
        else:
            found += [
                item
                for item in _public_docstrings(name, tree)
                if item[0][len(name) + 1 :].split(".")[0] in exported
            ]
    return sorted(found, key=lambda item: -item[1])[:count]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at any depth of its file).

    ``from pkg import name`` counts as importing ``pkg.name`` where that is a
    module, else ``pkg``. A package's ``__init__`` importing its own submodules
    is how a package exports them, not a circle, so those edges are left out.
    """
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in modules else base)
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if not target or target == name:
                    continue
                if is_package and target.startswith(name + "."):
                    continue
                graph[name].add(target)
    return graph


def include_graph(root: Path) -> dict[str, set[str]]:
    """``cc/`` source stem -> the stems it includes (``x.cc`` and ``x.h`` are one node)."""

    def stem(path: str) -> str:
        return re.sub(r"(\.cu)?\.(cc|h|cu|cuh)$", "", path)

    graph: dict[str, set[str]] = {}
    for path in tracked_files(root, "cc"):
        if path.suffix not in (".cc", ".h", ".cu", ".cuh"):
            continue
        node = stem(path.relative_to(root).as_posix())
        edges = graph.setdefault(node, set())
        for included in _INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            if stem(included) != node:
                edges.add(stem(included))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot reach Python's recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def duplicate_pairs(root: Path) -> int | None:
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--repo", str(root), "--seconds", "300"], capture_output=True, text=True
    ).stdout
    match = re.match(r"(\d+) pairs", out)
    return int(match.group(1)) if match else 0


def measure(root: Path, with_duplicates: bool) -> dict[str, object]:
    modules = module_files(root)
    public = public_modules(modules)
    tool_modules = [m for m in public if re.match(r"partial_embedding\.(bench|demo)", m)]
    figures: dict[str, object] = {
        "lines": lines_per_room(root),
        "public_modules": len(public),
        "public_tool_modules": len(tool_modules),
        "longest_public_docstrings": longest_public_docstrings(modules),
        "python_circles": cycles(import_graph(modules)),
        "cc_circles": cycles(include_graph(root)),
    }
    if with_duplicates:
        figures["duplicate_pairs"] = duplicate_pairs(root)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--duplicates", action="store_true", help="count duplicate-code pairs too")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--check", action="store_true", help="print only the circles (check.sh --static)"
    )
    args = parser.parse_args(argv)
    if args.check:
        root = args.root.resolve()
        found = cycles(import_graph(module_files(root))) + cycles(include_graph(root))
        for circle in found:
            print("import circle: " + " <-> ".join(circle))
        return 1 if found else 0
    figures = measure(args.root.resolve(), args.duplicates)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        lines = figures["lines"]
        assert isinstance(lines, dict)
        print("lines: " + ", ".join(f"{room} {count:,}" for room, count in lines.items()))
        print(
            f"public modules: {figures['public_modules']} "
            f"({figures['public_tool_modules']} of them bench or demo: the commands' packages)"
        )
        docs = figures["longest_public_docstrings"]
        assert isinstance(docs, list)
        print("longest public docstrings: " + ", ".join(f"{n} {c}" for n, c in docs))
        for kind in ("python_circles", "cc_circles"):
            found = figures[kind]
            assert isinstance(found, list)
            print(f"{kind.replace('_', ' ')}: {len(found)}")
            for circle in found:
                print("  " + " <-> ".join(circle))
        if "duplicate_pairs" in figures:
            print(f"duplicate-code pairs: {figures['duplicate_pairs']}")
    return 1 if figures["python_circles"] or figures["cc_circles"] else 0


if __name__ == "__main__":
    sys.exit(main())
