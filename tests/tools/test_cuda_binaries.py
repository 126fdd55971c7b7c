"""build_tools/check_cuda_binaries.py on small libraries built here with the C compiler.

Each library carries a hand-made fat binary (the container layout NVIDIA's
fatbinary writes) in its .nv_fatbin section, and imports or exports CUDA
runtime names, so every rule of the check is exercised without a CUDA tool.
"""

from __future__ import annotations

import importlib.util
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "build_tools" / "check_cuda_binaries.py"
if not SCRIPT.exists():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)
COMPILER = shutil.which("cc") or shutil.which("gcc")
if COMPILER is None:
    pytest.skip("needs a C compiler", allow_module_level=True)

_spec = importlib.util.spec_from_file_location("check_cuda_binaries", SCRIPT)
assert _spec is not None and _spec.loader is not None
check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = check  # dataclasses look their module up
_spec.loader.exec_module(check)

PLAIN = 0x11  # 64-bit, Linux host: an uncompressed image


def entry(kind: int, arch: int, version: tuple[int, int], payload: bytes, flags=PLAIN) -> bytes:
    payload += b"\0" * (-len(payload) % 8)
    header = struct.pack("<HHIQII", kind, 0x0101, 64, len(payload), 0, 0)
    header += struct.pack("<HHIII", version[1], version[0], arch, 0, 0)
    header += struct.pack("<QQQ", flags, 0, 0)
    return header + payload


def ptx(arch: int, isa: str, **kwargs) -> bytes:
    text = f".version {isa}\n.target sm_{arch}\n.address_size 64\n".encode()
    major, minor = (int(x) for x in isa.split("."))
    return entry(1, arch, (major, minor), text, **kwargs)


def sass(arch: int, osabi=0x33, abi_version=7, entry_version=(1, 7)) -> bytes:
    # An ELF header with no sections: all the check reads of a cubin here.
    cubin = b"\x7fELF" + bytes([2, 1, 1, osabi, abi_version]) + b"\0" * 7
    cubin += struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, 0, arch, 64, 0, 0, 64, 0, 0)
    return entry(2, arch, entry_version, cubin)


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def build(tmp_path: Path, name: str, blob=b"", code="", needed=(), soname=None) -> Path:
    source = tmp_path / f"{name}.c"
    array = ", ".join(str(b) for b in blob) or "0"
    section = '__attribute__((section(".nv_fatbin"), aligned(8), used))' if blob else ""
    source.write_text(f"{section} const unsigned char fatbin_{name}[] = {{{array}}};\n{code}\n")
    library = tmp_path / (soname or f"lib{name}.so")
    command = [COMPILER, "-shared", "-fPIC", "-o", str(library), str(source)]
    if soname:
        command.append(f"-Wl,-soname,{soname}")
    command += [f"-L{tmp_path}", f"-Wl,-rpath,{tmp_path}", "-Wl,--no-as-needed"]
    command += [f"-l:{n}" for n in needed]
    subprocess.run(command, check=True)
    return library


CALLS_LAUNCH = "int cudaLaunchKernel(void); int launch(void) { return cudaLaunchKernel(); }"


def run(capsys, *arguments) -> tuple[int, str]:
    status = check.main([str(a) for a in arguments])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


GOOD = fatbin(sass(75), sass(80), sass(90), ptx(90, "8.5"))


def test_cuda_12_5_images_pass_and_are_listed(tmp_path, capsys):
    library = build(tmp_path, "good", GOOD)
    status, out = run(capsys, library, "--require-sass", "75,80,90", "--require-ptx", "90")
    assert status == 0, out
    assert "compute_90  PTX   PTX ISA 8.5" in out
    assert "sm_75  SASS  cubin ELF OS/ABI 0x33 v7  fatbin entry 1.7" in out


@pytest.mark.parametrize(
    "images, message",
    [
        ((sass(90), ptx(90, "9.0")), "PTX ISA 9.0 is newer than 8.5"),
        ((sass(90, osabi=0x41, abi_version=8, entry_version=(1, 8)),), "newer than CUDA 12's"),
        ((sass(90, entry_version=(1, 8)),), "fatbin entry version 1.8 is newer than 1.7"),
        ((ptx(90, "8.5", flags=PLAIN | 0x8000),), "compressed image"),
        ((sass(80),), "no SASS for sm_90"),
    ],
    ids=["ptx-isa-9.0", "cubin-cuda-13-format", "entry-version-1.8", "compressed", "missing-arch"],
)
def test_images_too_new_or_missing_fail(tmp_path, capsys, images, message):
    library = build(tmp_path, "bad", fatbin(*images))
    status, out = run(capsys, library, "--require-sass", "90")
    assert status == 1
    assert message in out


def test_runtime_from_libcudart_12_that_defines_the_symbols_passes(tmp_path, capsys):
    build(
        tmp_path, "rt12", code="int cudaLaunchKernel(void) { return 0; }", soname="libcudart.so.12"
    )
    library = build(tmp_path, "user", GOOD, CALLS_LAUNCH, needed=["libcudart.so.12"])
    status, out = run(capsys, library)
    assert status == 0, out
    assert "libcudart.so.12 (1 symbols, all defined there" in out


@pytest.mark.parametrize(
    "runtime_code, soname, message",
    [
        ("int cudaLaunchKernel(void) { return 0; }", "libcudart.so.13", "allowed:"),
        (
            "int cudaMalloc(void) { return 0; }",
            "libcudart.so.12",
            "does not define cudaLaunchKernel",
        ),
    ],
    ids=["cuda-13-runtime", "symbol-not-in-runtime"],
)
def test_runtime_elsewhere_fails(tmp_path, capsys, runtime_code, soname, message):
    build(tmp_path, "rt", code=runtime_code, soname=soname)
    library = build(tmp_path, "user", GOOD, CALLS_LAUNCH, needed=[soname])
    status, out = run(capsys, library)
    assert status == 1
    assert message in out


def test_exported_runtime_symbol_fails(tmp_path, capsys):
    library = build(tmp_path, "exporter", GOOD, "int cudaMalloc(void) { return 0; }")
    status, out = run(capsys, library)
    assert status == 1
    assert "exports CUDA runtime symbols: cudaMalloc" in out
