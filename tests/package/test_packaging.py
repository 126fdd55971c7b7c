"""Tests of what the package promises about its installation.

- Keras: only the tested minor release line is accepted, by the install
  requirements and at import, which names the tested line in one message.
- The wheel (``build_tools/build_wheel.sh``): tagged manylinux, pinning
  TensorFlow and Keras, without libtensorflow_framework.so.2 inside and without
  a library search path of the machine that built it.

The wheel checks need the package imported from an installed wheel (as CI runs
them, from a copy of ``tests/`` outside the source tree; the manylinux checks
from a wheel that build_wheel.sh repaired) and skip otherwise;
``PE_EXPECT_INSTALLED_WHEEL=1`` (set by CI) turns such a skip into a failure.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import _version
from partial_embedding._internal import framework_private
from partial_embedding.errors import KerasVersionError

DISTRIBUTION = "tf-partial-embedding"
PACKAGE_DIR = Path(pe.__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parents[1]


def _minor_line(release: str) -> str:
    major, minor = release.split(".")
    return f"{major}.{int(minor) + 1}"


# --- Keras: any release TensorFlow accepts imports; the checked list decides ------


def test_installed_keras_is_on_a_tested_line():
    assert _version.is_tested_keras(keras.version()), keras.version()
    _version.check_keras_version()


def test_framework_private_names_the_same_tested_line():
    assert framework_private.TESTED_KERAS_LINES == _version.TESTED_KERAS_LINES
    assert _version.TESTED_KERAS in _version.TESTED_KERAS_LINES


@pytest.mark.parametrize(
    "release", ["3.12.0", "3.13.2", "3.14.2", "3.15.1", "3.15.3.dev0", "3.16.0", "3.20.1rc1"]
)
def test_every_keras_3_that_tensorflow_accepts_imports(monkeypatch, release):
    monkeypatch.setattr(keras, "version", lambda: release)
    _version.check_keras_version()
    _version.check_keras_version(release)


@pytest.mark.parametrize("release", ["3.11.3", "2.15.0", "4.0.0", "3", "nightly"])
def test_a_keras_tensorflow_refuses_fails_naming_the_range(monkeypatch, release):
    monkeypatch.setattr(keras, "version", lambda: release)
    with pytest.raises(KerasVersionError) as error:
        _version.check_keras_version()
    assert isinstance(error.value, ImportError)
    message = str(error.value)
    assert f"Keras 3 from {_version.MIN_KERAS} on" in message, message
    assert f"the installed Keras is {release};" in message, message
    assert f"keras=={_version.TESTED_KERAS}.*" in message, message


def _import_with_keras_version(release: str) -> str:
    # A fresh interpreter: the check runs when the package is first imported,
    # before the modules that reach into Keras.
    code = textwrap.dedent(
        f"""
        import keras
        keras.version = lambda: {release!r}
        try:
            import partial_embedding
        except ImportError as error:
            print(type(error).__name__, error)
        else:
            print("imported")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_import_works_on_an_untested_newer_keras():
    assert _import_with_keras_version("3.16.0") == "imported"


@pytest.mark.slow
def test_import_fails_on_a_keras_tensorflow_refuses():
    output = _import_with_keras_version("3.11.0")
    assert output.startswith("KerasVersionError "), output
    assert "installed Keras is 3.11.0" in output, output


def test_a_missing_framework_member_fails_at_construction_naming_it(monkeypatch):
    members = (*framework_private.FRAMEWORK_MEMBERS, ("keras.layers", "Layer._gone_in_keras_99"))
    monkeypatch.setattr(framework_private, "FRAMEWORK_MEMBERS", members)
    framework_private.missing_framework_members.cache_clear()
    try:
        with pytest.raises(framework_private.IncompatibleFrameworkError) as error:
            pe.PartialEmbedding(4, 2)
        message = str(error.value)
        assert "keras.layers.Layer._gone_in_keras_99" in message, message
        assert keras.version() in message and tf.__version__ in message, message
    finally:
        monkeypatch.undo()
        framework_private.missing_framework_members.cache_clear()
    pe.PartialEmbedding(4, 2)


def test_ci_requirements_pin_the_tested_keras_line():
    requirements = SOURCE_ROOT / "build_tools" / "requirements-ci.txt"
    if not requirements.exists():
        pytest.skip("not run from a source checkout")
    lines = requirements.read_text(encoding="utf-8").splitlines()
    assert f"keras=={_version.TESTED_KERAS}.*" in lines
    assert f"tensorflow=={_version.REQUIRED_TENSORFLOW}.*" in lines


# --- the installed wheel ----------------------------------------------------------


@pytest.fixture(scope="module")
def wheel_distribution() -> importlib.metadata.Distribution:
    """The installed distribution the imported package came from."""
    reason = ""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        reason = f"{DISTRIBUTION} is not installed"
    else:
        installed_init = Path(distribution.locate_file("partial_embedding/__init__.py"))
        if (SOURCE_ROOT / "setup.py").exists():
            reason = f"partial_embedding is imported from a source checkout ({PACKAGE_DIR})"
        elif distribution.read_text("WHEEL") is None:
            reason = f"{DISTRIBUTION} was not installed from a wheel"
        elif not installed_init.exists() or installed_init.resolve() != Path(pe.__file__).resolve():
            reason = (
                f"partial_embedding is imported from {PACKAGE_DIR}, not from the installed wheel"
            )
    _skip_unless_expected(reason)
    return distribution


def _skip_unless_expected(reason: str) -> None:
    if reason:
        if os.environ.get("PE_EXPECT_INSTALLED_WHEEL") == "1":
            pytest.fail(f"PE_EXPECT_INSTALLED_WHEEL=1, but {reason}")
        pytest.skip(reason)


def _wheel_tags(distribution: importlib.metadata.Distribution) -> list[str]:
    return [
        line.split(":", 1)[1].strip()
        for line in (distribution.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]


@pytest.fixture(scope="module")
def repaired_wheel(wheel_distribution) -> importlib.metadata.Distribution:
    """The installed wheel, when build_tools/build_wheel.sh made it (a plain
    ``pip install .`` installs an unrepaired ``linux`` wheel)."""
    tags = _wheel_tags(wheel_distribution)
    if not any("-manylinux_" in tag for tag in tags):
        _skip_unless_expected(f"the installed wheel is tagged {tags}, not repaired by auditwheel")
    return wheel_distribution


def _requirement(distribution: importlib.metadata.Distribution, name: str) -> str:
    found = [
        requirement
        for requirement in distribution.requires or []
        if requirement.split(";")[0].strip().startswith(name)
        and requirement[len(name) :][:1] in "<>=!~ "
    ]
    assert len(found) == 1, distribution.requires
    return found[0]


def test_wheel_pins_tensorflow_line_and_keras_range(wheel_distribution):
    release = _version.REQUIRED_TENSORFLOW
    specifiers = set(_requirement(wheel_distribution, "tensorflow")[len("tensorflow") :].split(","))
    assert specifiers == {f">={release}", f"<{_minor_line(release)}"}, specifiers
    specifiers = set(_requirement(wheel_distribution, "keras")[len("keras") :].split(","))
    assert specifiers == {f">={_version.MIN_KERAS}", "<4"}, specifiers


def test_wheel_is_tagged_manylinux(repaired_wheel):
    tags = _wheel_tags(repaired_wheel)
    assert tags, "no Tag in the wheel's WHEEL file"
    for tag in tags:
        assert "-manylinux_" in tag, tag


def test_wheel_leaves_tensorflow_framework_out(wheel_distribution):
    files = [str(path) for path in wheel_distribution.files or []]
    assert any(path.endswith("_partial_embedding_ops.so") for path in files), files
    assert not [path for path in files if "libtensorflow_framework" in path]


def test_wheel_libraries_search_no_build_machine_path(repaired_wheel):
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed")
    libraries = sorted(PACKAGE_DIR.glob("*.so"))
    assert libraries
    for library in libraries:
        dynamic = subprocess.run(
            [readelf, "-d", str(library)], capture_output=True, text=True, check=True
        ).stdout
        paths = [line for line in dynamic.splitlines() if "RPATH" in line or "RUNPATH" in line]
        # Only paths relative to the library itself ($ORIGIN) hold elsewhere.
        assert all("$ORIGIN" in line and "[/" not in line for line in paths), (library, paths)


# --- the manylinux tag holds for every shipped library -------------------------------

#: Per manylinux tag, the newest version of each versioned library a shipped
#: library may ask for (auditwheel's policy for x86_64): the tags our wheels
#: get (build_tools/build_wheel.sh asks for manylinux_2_27, TensorFlow 2.21's).
MANYLINUX_SYMBOL_LIMITS = {
    (2, 27): {"GLIBC": (2, 27), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)},
    (2, 28): {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)},
}
_VERSION_NEEDED = re.compile(r"\((GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\)\s+(\S+)$")


def _manylinux_floor(tags: list[str]) -> tuple[int, int]:
    """The oldest glibc the wheel's tags promise (a wheel with several takes the lowest)."""
    floors = [
        (int(match[1]), int(match[2]))
        for tag in tags
        for match in [re.search(r"-manylinux_(\d+)_(\d+)_x86_64$", tag)]
        if match
    ]
    assert floors, f"no manylinux x86_64 platform in the wheel's tags {tags}"
    return min(floors)


def _shipped_libraries(distribution: importlib.metadata.Distribution) -> list[Path]:
    return sorted(
        Path(distribution.locate_file(path))
        for path in distribution.files or []
        if path.name.endswith(".so") or ".so." in path.name
    )


def test_wheel_libraries_ask_for_no_symbol_version_above_the_tag(repaired_wheel):
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    floor = _manylinux_floor(_wheel_tags(repaired_wheel))
    assert floor in MANYLINUX_SYMBOL_LIMITS, f"no symbol limits known for manylinux_{floor}"
    limits = MANYLINUX_SYMBOL_LIMITS[floor]
    libraries = _shipped_libraries(repaired_wheel)
    assert any(library.name == "_partial_embedding_ops.so" for library in libraries), libraries
    too_new, unbound = [], []
    for library in libraries:
        table = subprocess.run(
            [objdump, "-T", str(library)], capture_output=True, text=True, check=True
        ).stdout
        for line in table.splitlines():
            match = _VERSION_NEEDED.search(line)
            if match:
                family, version, symbol = match.groups()
                if tuple(int(part) for part in version.split(".")) > limits[family]:
                    too_new.append(f"{library.name}: {symbol}@{family}_{version}")
            # cc/compat/old_symbol_versions.cc's stand-ins for old versions must
            # all have been bound to them (they are, unless LTO compiled it).
            elif "*UND*" in line and line.split()[-1].startswith("pe_"):
                unbound.append(f"{library.name}: {line.split()[-1]}")
    assert not too_new, f"newer than manylinux_{floor[0]}_{floor[1]} allows: {too_new}"
    assert not unbound, f"old-version stand-ins left unbound: {unbound}"


def test_wheel_has_a_kernel_module_for_each_python_it_is_tagged_for(repaired_wheel):
    tags = _wheel_tags(repaired_wheel)
    pythons = {python for tag in tags for python in tag.split("-")[0].split(".")}
    modules = {
        library.name.split(".")[1]
        for library in _shipped_libraries(repaired_wheel)
        if library.name.startswith("_kernels.")
    }
    # cpython-312-x86_64-linux-gnu -> cp312
    shipped = {"cp" + module.split("-")[1] for module in modules}
    assert shipped == pythons, (tags, sorted(modules))
    assert f"cp{sys.version_info[0]}{sys.version_info[1]}" in pythons
