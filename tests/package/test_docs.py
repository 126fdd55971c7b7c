"""Runnable documentation: docstring examples, and the Python blocks and links
of the README and of the pages under docs/.

Only blocks fenced as ```python run; a block that cannot run in a test (a shell
command, a cluster, printed output) is fenced as ```bash, ```text or ```py.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import partial_embedding

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Compiled libraries: no Python docstrings to run.
NOT_DOCUMENTED = {
    "partial_embedding._kernels",
    "partial_embedding._partial_embedding_ops",
    "partial_embedding._partial_embedding_xla",
}
# The README is the front page: what a user reads in five minutes.
README_MAX_LINES = 300
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_ANY_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _modules() -> list[str]:
    """The package and every module below it, subpackages' modules included."""
    names = [partial_embedding.__name__]
    for info in pkgutil.walk_packages(partial_embedding.__path__, partial_embedding.__name__ + "."):
        if info.name not in NOT_DOCUMENTED:
            names.append(info.name)
    return names


def _pages() -> list[Path]:
    """The README, then every page under docs/ in name order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _python_blocks() -> list[tuple[str, int, str]]:
    """(page, index of the block on that page, code) for every ```python block."""
    blocks = []
    for page in _pages():
        for index, code in enumerate(_PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))):
            blocks.append((_page_name(page), index, code))
    return blocks


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _ANY_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return {_slug(heading) for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def _relative_links() -> list[tuple[str, str]]:
    """(page, target) for every link of a page that is not a web address."""
    links = []
    for page in _pages():
        text = _ANY_BLOCK.sub("", page.read_text(encoding="utf-8"))
        for target in _LINK.findall(text):
            if not re.match(r"[a-z]+:", target):
                links.append((_page_name(page), target))
    return links


# Optional extras an example may import: without them installed (keras-rs
# needs Python >= 3.11), the examples that import them are left out.
OPTIONAL_IMPORTS = ("keras_rs",)


def _missing_extras(code: str) -> list[str]:
    """The optional extras ``code`` imports that are not installed."""
    return [
        name
        for name in OPTIONAL_IMPORTS
        if re.search(rf"\bimport {name}\b|\bfrom {name}\b", code)
        and importlib.util.find_spec(name) is None
    ]


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples_run(module_name: str) -> None:
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(module):
        if not _missing_extras("\n".join(example.source for example in test.examples)):
            runner.run(test, out=lambda text: print(text, end=""))
    failed = runner.summarize(verbose=False).failed
    assert failed == 0, f"{failed} docstring example(s) failed in {module_name}"


def test_public_api_has_examples() -> None:
    missing = []
    for name in partial_embedding.__all__:
        item = getattr(partial_embedding, name)
        is_exception = isinstance(item, type) and issubclass(item, BaseException)
        if callable(item) and not is_exception and ">>>" not in (item.__doc__ or ""):
            missing.append(name)
    assert not missing, f"public names without a >>> example: {missing}"


def test_docs_pages_are_found() -> None:
    """The page list is not silently empty (a copy of the tests without docs/, say)."""
    names = {page.name for page in _pages()}
    assert {"README.md", "layout.md", "bad_input.md"} <= names, sorted(names)
    assert len(_python_blocks()) >= 10, [f"{page} {index}" for page, index, _ in _python_blocks()]


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize(
    ("page", "index", "code"),
    _python_blocks(),
    ids=[f"{page}-{index}" for page, index, _ in _python_blocks()],
)
def test_python_blocks_run(page: str, index: int, code: str, tmp_path, monkeypatch) -> None:
    if missing := _missing_extras(code):
        pytest.skip(f"needs {missing}, not installed")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} python block {index}", "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize(("page", "target"), _relative_links())
def test_relative_links_resolve(page: str, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    source = ROOT / page
    linked = (source.parent / path_part).resolve() if path_part else source
    assert linked.exists(), f"{page}: link to {target}: no file {linked}"
    if anchor and linked.suffix == ".md":
        assert anchor in _anchors(linked), (
            f"{page}: link to {target}: {linked.name} has no heading with anchor #{anchor}"
        )
