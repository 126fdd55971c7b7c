"""Reads built libraries and fails if their GPU code or CUDA runtime binding
would need more than TensorFlow 2.21's own GPU build needs.

    python build_tools/check_cuda_binaries.py LIBRARY... [--require-sass 75,80,90]
        [--require-ptx 90] [--max-toolkit 12.5] [--max-ptx-isa 8.5]
        [--tensorflow-lib DIR] [--load-in-tensorflow OPS_LIBRARY] [--json FILE]

No CUDA tool is needed: the script reads the ELF files itself.

Device code. Every image in each library's ``.nv_fatbin`` section is listed
(architecture, SASS or PTX, and the versions it records) and the check fails
when:
  * a PTX image's ISA is newer than --max-ptx-isa (CUDA 12.5 writes ISA 8.5);
  * a SASS image (a cubin) is in a format newer than the CUDA 11-12 toolkits
    write (ELF OS/ABI 0x33, ABI version 7; CUDA 13 writes 0x41, version 8), or
    names a toolkit newer than --max-toolkit in its notes (ptxas of CUDA 12.5
    writes no such note; later ones do);
  * an image is compressed (this project writes them uncompressed, so that
    every CUDA 12 driver reads them and this script can check them);
  * an architecture asked for by --require-sass / --require-ptx is missing.

Runtime binding. A library may take the CUDA runtime from exactly one place:
  * nowhere outside itself (no CUDA runtime symbol imported: a static runtime
    kept private, or no CUDA at all);
  * libtensorflow_framework.so.2, whose exported CUDA runtime API loads
    TensorFlow's libcudart.so.12 (the op library of the default GPU build);
  * libcudart.so.12 (the TF-free kernel module of the GPU check).
It fails if a library exports a CUDA runtime symbol, needs another CUDA
runtime (libcudart.so.13, ...), or imports a CUDA runtime symbol that the one
runtime library it needs does not define. --load-in-tensorflow loads the op
library into TensorFlow in a child process with eager binding and the dynamic
linker's binding log, and fails unless every CUDA runtime symbol of the op
library was bound to libtensorflow_framework.so.2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2
# Entry flags seen in uncompressed images: 64-bit (0x1) and Linux host (0x10).
PLAIN_ENTRY_FLAGS = 0x1 | 0x10
# A cubin's ELF identification: the CUDA 11-12 toolkits write OS/ABI 0x33 and
# ABI version 7; CUDA 13 writes 0x41 and version 8.
CUBIN_OSABI_CUDA12 = 0x33
CUBIN_ABI_VERSION_CUDA12 = 7
CUDA_SYMBOL = re.compile(r"^(cuda|__cuda)\w*$")
CUDA_RUNTIMES = re.compile(r"^libcudart\.so(\.\d+)*$")
TENSORFLOW_FRAMEWORK = "libtensorflow_framework.so.2"


def version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


# --- ELF reading -------------------------------------------------------------


@dataclass
class Elf:
    """The parts of an ELF64 little-endian file the checks need."""

    data: bytes
    sections: dict[str, tuple[int, bytes]]  # name -> (type, contents)

    @classmethod
    def read(cls, data: bytes) -> Elf:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        headers = [
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
        ]
        if not headers:
            return cls(data, {})
        names_offset = headers[shstrndx][4]
        sections = {}
        for name_offset, kind, _, _, offset, size, *_ in headers:
            start = names_offset + name_offset
            name = data[start : data.index(b"\0", start)].decode()
            contents = b"" if kind == 8 else data[offset : offset + size]  # 8: NOBITS
            sections[name] = (kind, contents)
        return cls(data, sections)

    def dynamic_strings(self, tag: int) -> list[str]:
        """DT_NEEDED (1), DT_RUNPATH (29) or DT_RPATH (15) strings."""
        dynamic = self.sections.get(".dynamic", (0, b""))[1]
        strings = self.sections.get(".dynstr", (0, b""))[1]
        found = []
        for i in range(0, len(dynamic) - 15, 16):
            entry_tag, value = struct.unpack_from("<qQ", dynamic, i)
            if entry_tag == 0:
                break
            if entry_tag == tag:
                found.append(strings[value : strings.index(b"\0", value)].decode())
        return found

    def dynamic_symbols(self) -> tuple[set[str], set[str]]:
        """(defined global/weak symbols, undefined symbols) of .dynsym."""
        symbols = self.sections.get(".dynsym", (0, b""))[1]
        strings = self.sections.get(".dynstr", (0, b""))[1]
        defined: set[str] = set()
        undefined: set[str] = set()
        for i in range(24, len(symbols) - 23, 24):  # entry 0 is the null symbol
            name_offset, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", symbols, i)
            name = strings[name_offset : strings.index(b"\0", name_offset)].decode()
            binding = info >> 4
            if not name or binding not in (1, 2):  # GLOBAL, WEAK
                continue
            (undefined if shndx == 0 else defined).add(name)
        return defined, undefined


# --- fat binaries --------------------------------------------------------------


@dataclass
class Image:
    """One image of a fat binary, with what it says about the toolkit."""

    kind: str  # "SASS" or "PTX"
    arch: int  # 75 for sm_75 / compute_75
    entry_version: str  # the fatbin entry's own version field, major.minor
    flags: int
    compressed: bool
    ptx_isa: str | None = None  # PTX: the ISA version (.version)
    cubin_abi: str | None = None  # SASS: "OS/ABI 0x33 v7"
    toolkit: str | None = None  # the toolkit a note names, when there is one
    problems: list[str] = field(default_factory=list)

    def describe(self) -> str:
        prefix = "sm" if self.kind == "SASS" else "compute"
        parts = [f"{prefix}_{self.arch:<3d} {self.kind:<4s}"]
        if self.kind == "PTX":
            parts.append(f"PTX ISA {self.ptx_isa}")
        else:
            parts.append(f"cubin ELF {self.cubin_abi}")
        if self.kind == "SASS":
            parts.append(f"fatbin entry {self.entry_version}")
            parts.append(f"toolkit {self.toolkit or 'not noted (ptxas 12.5 writes no note)'}")
        parts.append("compressed" if self.compressed else "uncompressed")
        return "  ".join(part for part in parts if part)


def fatbin_images(section: bytes) -> list[Image]:
    images = []
    offset = 0
    while offset + 16 <= len(section):
        magic, _, header_size, body_size = struct.unpack_from("<IHHQ", section, offset)
        if magic != FATBIN_MAGIC:
            offset += 8  # padding between the fat binaries of several objects
            continue
        entry = offset + header_size
        end = entry + body_size
        while entry < end:
            kind, _, entry_header_size, payload_size = struct.unpack_from("<HHIQ", section, entry)
            minor, major, arch = struct.unpack_from("<HHI", section, entry + 24)
            (flags,) = struct.unpack_from("<Q", section, entry + 40)
            (uncompressed_size,) = struct.unpack_from("<Q", section, entry + 56)
            payload = section[entry + entry_header_size : entry + entry_header_size + payload_size]
            image = Image(
                kind="PTX" if kind == KIND_PTX else "SASS" if kind == KIND_ELF else f"kind{kind}",
                arch=arch,
                entry_version=f"{major}.{minor}",
                flags=flags,
                compressed=flags & ~PLAIN_ENTRY_FLAGS != 0 or uncompressed_size != 0,
            )
            if kind == KIND_PTX:
                image.ptx_isa = f"{major}.{minor}"
                if not image.compressed:
                    match = re.search(rb"^\s*\.version\s+(\d+\.\d+)", payload, re.MULTILINE)
                    if match and match.group(1).decode() != image.ptx_isa:
                        image.problems.append(
                            f".version {match.group(1).decode()} disagrees with the entry"
                        )
            elif kind == KIND_ELF and not image.compressed:
                read_cubin(payload, image)
            images.append(image)
            entry += entry_header_size + payload_size
        offset = (end + 7) & ~7
    return images


def read_cubin(payload: bytes, image: Image) -> None:
    cubin = Elf.read(payload)
    osabi, abi_version = payload[7], payload[8]
    image.cubin_abi = f"OS/ABI {osabi:#04x} v{abi_version}"
    if osabi != CUBIN_OSABI_CUDA12 or abi_version > CUBIN_ABI_VERSION_CUDA12:
        image.problems.append(f"cubin format {image.cubin_abi} is newer than CUDA 12's (0x33 v7)")
    tkinfo = cubin.sections.get(".note.nv.tkinfo", (0, b""))[1]
    match = re.search(rb"release (\d+\.\d+)", tkinfo)
    if match:
        image.toolkit = match.group(1).decode()
    cuinfo = cubin.sections.get(".note.nv.cuinfo", (0, b""))[1]
    if image.toolkit is None and len(cuinfo) >= 24:
        # Note header (12 bytes + 12-byte name), then version, sm, toolkit*10.
        (toolkit,) = struct.unpack_from("<H", cuinfo, 24 + 4)
        image.toolkit = f"{toolkit // 10}.{toolkit % 10}"


# --- the checks ----------------------------------------------------------------


def check_images(images: list[Image], max_toolkit: str, max_ptx_isa: str) -> list[str]:
    failures = []
    for image in images:
        name = f"{'sm' if image.kind == 'SASS' else 'compute'}_{image.arch} {image.kind}"
        if image.compressed:
            failures.append(f"{name}: compressed image (entry flags {image.flags:#x})")
        if image.ptx_isa and version_tuple(image.ptx_isa) > version_tuple(max_ptx_isa):
            failures.append(f"{name}: PTX ISA {image.ptx_isa} is newer than {max_ptx_isa}")
        if image.toolkit and version_tuple(image.toolkit) > version_tuple(max_toolkit):
            failures.append(f"{name}: built by CUDA {image.toolkit}, newer than {max_toolkit}")
        if image.kind == "SASS" and version_tuple(image.entry_version) > (1, 7):
            # CUDA 11-12 write 1.7 for cubins; CUDA 13 writes 1.8.
            failures.append(f"{name}: fatbin entry version {image.entry_version} is newer than 1.7")
        failures += [f"{name}: {problem}" for problem in image.problems]
    return failures


def find_library(name: str, elf: Elf, library: Path, tensorflow_lib: str | None) -> Path | None:
    search = []
    for runpath in elf.dynamic_strings(29) + elf.dynamic_strings(15):
        search += [p.replace("$ORIGIN", str(library.parent)) for p in runpath.split(":")]
    if tensorflow_lib:
        search.append(tensorflow_lib)
    elif name == TENSORFLOW_FRAMEWORK:
        # The installed TensorFlow's directory, found without importing it.
        spec = importlib.util.find_spec("tensorflow")
        if spec is not None and spec.submodule_search_locations:
            search.append(list(spec.submodule_search_locations)[0])
    search += os.environ.get("LD_LIBRARY_PATH", "").split(":")
    for directory in search:
        candidate = Path(directory) / name
        if directory and candidate.is_file():
            return candidate
    return None


def check_runtime(library: Path, elf: Elf, tensorflow_lib: str | None) -> tuple[str, list[str]]:
    defined, undefined = elf.dynamic_symbols()
    exported = sorted(s for s in defined if CUDA_SYMBOL.match(s))
    imported = sorted(s for s in undefined if CUDA_SYMBOL.match(s))
    needed = elf.dynamic_strings(1)
    runtimes = [n for n in needed if CUDA_RUNTIMES.match(n)]
    failures = []
    if exported:
        failures.append(f"exports CUDA runtime symbols: {', '.join(exported[:5])}")
    if not imported:
        if runtimes:
            failures.append(f"needs {', '.join(runtimes)} but imports no CUDA runtime symbol")
        return "none imported (private static runtime, or no CUDA)", failures
    providers = runtimes + ([TENSORFLOW_FRAMEWORK] if TENSORFLOW_FRAMEWORK in needed else [])
    if providers != [TENSORFLOW_FRAMEWORK] and providers != ["libcudart.so.12"]:
        failures.append(
            f"imports {len(imported)} CUDA runtime symbols from {providers or 'nowhere'}; "
            f"allowed: {TENSORFLOW_FRAMEWORK} alone or libcudart.so.12 alone"
        )
        return f"ambiguous: {providers}", failures
    provider = providers[0]
    path = find_library(provider, elf, library, tensorflow_lib)
    if path is None:
        failures.append(f"cannot find {provider} to check the symbols it must define")
        return provider, failures
    provided, _ = Elf.read(path.read_bytes()).dynamic_symbols()
    missing = [s for s in imported if s not in provided]
    if missing:
        failures.append(f"{provider} does not define {', '.join(missing[:5])}")
    return f"{provider} ({len(imported)} symbols, all defined there: {path})", failures


def check_bindings_in_tensorflow(ops_library: Path) -> list[str]:
    """Loads the op library into TensorFlow with LD_BIND_NOW and the binding log."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "bindings"
        env = dict(os.environ, LD_BIND_NOW="1", LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(log))
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        code = (
            "import tensorflow as tf, sys; tf.load_op_library(sys.argv[1]); "
            "print(tf.sysconfig.get_lib())"
        )
        result = subprocess.run(
            [sys.executable, "-c", code, str(ops_library.resolve())],
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            return [f"loading {ops_library} into TensorFlow failed: {result.stderr[-2000:]}"]
        pattern = re.compile(
            r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `((?:cuda|__cuda)\w*)'"
        )
        bound: dict[str, str] = {}
        for log_file in Path(scratch).glob("bindings*"):
            for line in log_file.read_text(errors="replace").splitlines():
                match = pattern.search(line)
                if match and Path(match.group(1)).name == ops_library.name:
                    bound[match.group(3)] = match.group(2)
    _, undefined = Elf.read(ops_library.read_bytes()).dynamic_symbols()
    imported = {s for s in undefined if CUDA_SYMBOL.match(s)}
    failures = [
        f"{symbol} bound to {target}, not {TENSORFLOW_FRAMEWORK}"
        for symbol, target in sorted(bound.items())
        if Path(target).name != TENSORFLOW_FRAMEWORK
    ]
    unbound = sorted(imported - bound.keys())
    if unbound:
        failures.append(f"no binding logged for {', '.join(unbound[:5])}")
    print(
        f"  loaded into TensorFlow: {len(bound)} of {len(imported)} CUDA runtime symbols "
        f"bound to {TENSORFLOW_FRAMEWORK}"
        if not failures
        else "  loaded into TensorFlow: bindings below"
    )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("libraries", nargs="+", type=Path)
    parser.add_argument("--require-sass", default="", help="e.g. 75,80,90 (any library)")
    parser.add_argument("--require-ptx", default="", help="e.g. 90 (any library)")
    parser.add_argument("--max-toolkit", default="12.5")
    parser.add_argument("--max-ptx-isa", default="8.5")
    parser.add_argument(
        "--tensorflow-lib",
        help="directory of libtensorflow_framework.so.2 (default: the installed TensorFlow's)",
    )
    parser.add_argument("--load-in-tensorflow", type=Path, help="op library to load and trace")
    parser.add_argument("--json", type=Path, help="also write the findings here")
    args = parser.parse_args(argv)

    failures: list[str] = []
    report: dict[str, dict] = {}
    sass_found: set[int] = set()
    ptx_found: set[int] = set()
    for library in args.libraries:
        elf = Elf.read(library.read_bytes())
        images = fatbin_images(elf.sections.get(".nv_fatbin", (0, b""))[1])
        runtime, runtime_failures = check_runtime(library, elf, args.tensorflow_lib)
        image_failures = check_images(images, args.max_toolkit, args.max_ptx_isa)
        print(f"{library}:")
        print(f"  CUDA runtime: {runtime}")
        if not images:
            print("  no device code")
        for image in sorted(images, key=lambda i: (i.arch, i.kind)):
            print(f"  {image.describe()}")
        sass_found |= {i.arch for i in images if i.kind == "SASS"}
        ptx_found |= {i.arch for i in images if i.kind == "PTX"}
        failures += [f"{library.name}: {f}" for f in runtime_failures + image_failures]
        report[str(library)] = {
            "runtime": runtime,
            "images": [asdict(image) for image in images],
        }
    for wanted, found, kind in (
        (args.require_sass, sass_found, "SASS for sm"),
        (args.require_ptx, ptx_found, "PTX for compute"),
    ):
        for arch in filter(None, wanted.split(",")):
            if int(arch) not in found:
                failures.append(f"no {kind}_{arch} in any library")
    if args.load_in_tensorflow:
        failures += check_bindings_in_tensorflow(args.load_in_tensorflow)
    if args.json:
        args.json.write_text(json.dumps({"libraries": report, "failures": failures}, indent=2))
    for failure in failures:
        print(f"check_cuda_binaries FAIL: {failure}", file=sys.stderr)
    if failures:
        return 1
    print(
        f"check_cuda_binaries: OK: {len(args.libraries)} libraries; device code no newer than "
        f"CUDA {args.max_toolkit} / PTX ISA {args.max_ptx_isa}; CUDA runtime bound as intended"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
