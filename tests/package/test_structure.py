"""The package's shape (issue #23): one checked place for framework internals,
one-way imports, and functions and modules of a readable size.

Everything here reads the installed package's source with ``ast``; nothing
runs it except the class walk, which imports the public modules.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import partial_embedding
from pe_testing import defined_names

PACKAGE = Path(partial_embedding.__file__).resolve().parent
FRAMEWORK_PRIVATE = PACKAGE / "_internal" / "framework_private.py"
MAX_FUNCTION_LINES, MAX_EXAMPLE_FUNCTION_LINES, MAX_MODULE_LINES = 60, 80, 700
FRAMEWORK_MODULES = ("keras.src", "tensorflow.python", "tensorflow.core", "tf_keras")


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()
TREES = {path: ast.parse(source) for path, source in SOURCES.items()}


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


OUR_NAMES = set().union(*(defined_names(tree) for tree in TREES.values()))


def _framework_reaches(tree: ast.AST) -> list[str]:
    """Private Keras / TensorFlow members named in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(FRAMEWORK_MODULES):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.startswith(FRAMEWORK_MODULES)
            ]
        elif isinstance(node, ast.Attribute):
            if node.attr == "__internal__":
                found.append(ast.unparse(node))
            elif (
                node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in OUR_NAMES
            ):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(FRAMEWORK_MODULES) and " " not in node.value:
                found.append(repr(node.value))
    return found


def test_only_framework_private_names_private_keras_or_tensorflow_members():
    offenders = {
        _relative(path): reaches
        for path, tree in TREES.items()
        if path != FRAMEWORK_PRIVATE and (reaches := _framework_reaches(tree))
    }
    assert not offenders, f"go through _internal/framework_private.py: {offenders}"


def test_the_check_itself_finds_private_members():
    tree = ast.parse(
        "import tensorflow as tf\nfrom keras.src.backend import x\n"
        "tf.__internal__.tracking.wrap([])\nvariable._member_nobody_here_defines\n"
    )
    assert sorted(_framework_reaches(tree)) == [
        "from keras.src.backend import ...",
        "tf.__internal__",
        "variable._member_nobody_here_defines",
    ]


def _our_modules() -> list[str]:
    names = ["partial_embedding"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="partial_embedding."):
        if ".demo" in info.name or ".bench" in info.name or info.name.endswith("__main__"):
            continue
        if info.name.rsplit(".", 1)[-1] in (
            "_partial_embedding_ops",
            "_partial_embedding_xla",
            "_kernels",
        ):
            continue
        names.append(info.name)
    return names


def test_no_class_outside_framework_private_overrides_a_private_framework_method():
    offenders = []
    for name in _our_modules():
        module = importlib.import_module(name)
        if module.__file__ and Path(module.__file__).resolve() == FRAMEWORK_PRIVATE:
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for attribute in vars(cls):
                if not attribute.startswith("_") or attribute.startswith("__"):
                    continue
                framework = [
                    base
                    for base in cls.__mro__[1:]
                    if not base.__module__.startswith("partial_embedding")
                    and attribute in vars(base)
                ]
                if framework:
                    offenders.append(f"{cls.__qualname__}.{attribute} ({framework[0].__name__})")
    assert not offenders, f"override through _internal/framework_private.py: {offenders}"


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _subpackage_imports(subpackage: str) -> dict[str, set[str]]:
    return {
        _relative(path): _imports(tree)
        for path, tree in TREES.items()
        if _relative(path).startswith(f"{subpackage}/")
    }


@pytest.mark.parametrize(
    "subpackage, forbidden",
    [("layers", "partial_embedding.optimizers"), ("optimizers", "partial_embedding.layers")],
)
def test_layers_and_optimizers_never_import_each_other(subpackage, forbidden):
    offenders = {
        path: sorted(i for i in imports if i == forbidden or i.startswith(forbidden + "."))
        for path, imports in _subpackage_imports(subpackage).items()
    }
    assert not {p: i for p, i in offenders.items() if i}


def test_internal_imports_nothing_above_it():
    allowed = (
        "partial_embedding._internal",
        "partial_embedding.errors",
        "partial_embedding._version",
    )
    offenders = {
        path: sorted(
            i for i in imports if i.startswith("partial_embedding") and not i.startswith(allowed)
        )
        for path, imports in _subpackage_imports("_internal").items()
    }
    assert not {p: i for p, i in offenders.items() if i}


def _private_member_imports(path: Path, tree: ast.AST) -> list[str]:
    """``from partial_embedding.x import _name`` where ``_name`` is a member of
    ``x`` (a function, class or value), not a private module of a package."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("partial_embedding"):
            module_path = PACKAGE.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                name = alias.name
                is_module = (module_path / f"{name}.py").exists() or (module_path / name).is_dir()
                if name.startswith("_") and not name.startswith("__") and not is_module:
                    found.append(f"{_relative(path)}: from {node.module} import {name}")
    return found


def test_no_module_imports_a_private_member_of_another():
    # What two modules share lives in _internal/ under a public name, or is public.
    found = [hit for path, tree in TREES.items() for hit in _private_member_imports(path, tree)]
    assert not found, found


def test_the_private_member_check_finds_one():
    tree = ast.parse(
        "from partial_embedding.ops.fused import _adam_scalars, masked_sparse_apply_adam"
    )
    found = _private_member_imports(PACKAGE / "ops" / "xla_custom_call.py", tree)
    assert found == [
        "ops/xla_custom_call.py: from partial_embedding.ops.fused import _adam_scalars"
    ]
    tree = ast.parse("from partial_embedding.layers import _arguments")
    assert _private_member_imports(PACKAGE / "layers" / "embedding.py", tree) == []


def test_ops_do_not_import_keras():
    offenders = {
        path: sorted(i for i in imports if i == "keras" or i.startswith("keras."))
        for path, imports in _subpackage_imports("ops").items()
    }
    assert not {p: i for p, i in offenders.items() if i}


def _docstring_lines(node: ast.AST) -> set[int]:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return set(range(body[0].lineno, body[0].end_lineno + 1))
    return set()


def code_lines(node: ast.AST, source_lines: list[str]) -> int:
    """Lines of a function that hold code: not blank, not only a comment, not
    a docstring (its own or a nested function's or class's)."""
    skipped = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            skipped |= _docstring_lines(inner)
    count = 0
    for number in range(node.lineno, node.end_lineno + 1):
        text = source_lines[number - 1].strip()
        if text and not text.startswith("#") and number not in skipped:
            count += 1
    return count


def test_code_lines_counts_code_only():
    source = 'def f(x):\n    """Doc.\n\n    More."""\n    # why\n\n    return x\n'
    node = ast.parse(source).body[0]
    assert code_lines(node, source.splitlines()) == 2


def test_no_function_is_too_long():
    offenders = []
    for path, tree in TREES.items():
        limit = (
            MAX_EXAMPLE_FUNCTION_LINES
            if _relative(path).startswith("examples/")
            else MAX_FUNCTION_LINES
        )
        lines = SOURCES[path].splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (count := code_lines(node, lines)) > limit:
                    offenders.append(f"{_relative(path)}:{node.lineno} {node.name} {count}")
    assert not offenders, offenders


def test_no_module_is_too_long():
    offenders = {
        _relative(path): len(source.splitlines())
        for path, source in SOURCES.items()
        if len(source.splitlines()) > MAX_MODULE_LINES
    }
    assert not offenders
