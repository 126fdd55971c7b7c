"""build_tools/build_cache.py: a second install of an unchanged checkout reuses the build.

The cache is tried on a small stand-in checkout (a few source files, a fake
build's outputs), so that what changes the key and what restore copies are
checked without compiling anything. The whole path (pip, the in-tree backend,
setup.py) was measured by hand: docs/wheels.md.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

BUILD_TOOLS = Path(__file__).resolve().parents[2] / "build_tools"
if not (BUILD_TOOLS / "build_cache.py").is_file():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("build_cache", BUILD_TOOLS / "build_cache.py")
assert _spec is not None and _spec.loader is not None
build_cache = importlib.util.module_from_spec(_spec)
sys.modules["build_cache"] = build_cache
_spec.loader.exec_module(build_cache)


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in checkout with the files the key reads."""
    for name in ("cc/core/row_rules.h", "cc/kernels/a_kernel.cc", *build_cache.SOURCE_FILES):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"// {name}\n")
    for name in build_cache.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PE_REBUILD", raising=False)
    return tmp_path


def _fake_build(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("_partial_embedding_ops.so", "_kernels.cpython-311-x86_64-linux-gnu.so"):
        (folder / name).write_text(text + name)
    info = folder / "_build_info.json"
    info.write_text('{"cuda": false}')
    return info


def test_the_key_follows_every_input(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = build_cache.build_key(checkout, True)
    assert build_cache.build_key(checkout, True) == key
    assert build_cache.build_key(checkout, False) != key
    header = checkout / "cc/core/row_rules.h"
    header.write_text(header.read_text() + "// one line more\n")
    changed = build_cache.build_key(checkout, True)
    assert changed != key
    monkeypatch.setenv("CMAKE_ARGS", "-DPE_ENABLE_CUDA=OFF")
    assert build_cache.build_key(checkout, True) != changed
    monkeypatch.delenv("CMAKE_ARGS")
    (checkout / "cc/kernels/new_kernel.cc").write_text("// new\n")
    assert build_cache.build_key(checkout, True) != changed


def test_a_kept_build_is_restored_and_a_changed_checkout_is_not(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = build_cache.BuildCache(checkout, True)
    assert not cache.available()
    built = tmp_path / "out1"
    info = _fake_build(built, "first ")
    cache.store(built, info)
    assert cache.available()

    restored = tmp_path / "out2"
    info_copy = tmp_path / "info_copy.json"
    assert build_cache.BuildCache(checkout, True).restore(restored, info_copy)
    assert sorted(path.name for path in restored.iterdir()) == sorted(
        path.name for path in built.iterdir()
    )
    for path in built.iterdir():
        assert (restored / path.name).read_bytes() == path.read_bytes()
    assert info_copy.read_bytes() == info.read_bytes()

    monkeypatch.setenv("PE_REBUILD", "1")
    assert not build_cache.BuildCache(checkout, True).restore(tmp_path / "out3")
    monkeypatch.delenv("PE_REBUILD")
    (checkout / "cc/core/row_rules.h").write_text("// changed\n")
    assert not build_cache.BuildCache(checkout, True).restore(tmp_path / "out4")
    assert not (tmp_path / "out4").exists()


def test_only_the_newest_builds_are_kept(checkout: Path, tmp_path: Path) -> None:
    header = checkout / "cc/core/row_rules.h"
    folders = []
    for version in range(build_cache.KEEP + 2):
        time.sleep(0.05)  # file times are coarser than a loop's turn
        header.write_text(f"// version {version}\n")
        cache = build_cache.BuildCache(checkout, True)
        cache.store(tmp_path / f"out{version}", _fake_build(tmp_path / f"out{version}", "x"))
        folders.append(cache.folder)
    kept = [folder for folder in folders if folder.exists()]
    assert kept == folders[-build_cache.KEEP :]


def test_a_build_without_outputs_is_not_kept(checkout: Path, tmp_path: Path) -> None:
    cache = build_cache.BuildCache(checkout, True)
    empty = tmp_path / "empty"
    empty.mkdir()
    cache.store(empty, empty / "_build_info.json")
    assert not cache.available()
