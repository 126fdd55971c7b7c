"""Compares the device code of two builds of the CUDA core, kernel by kernel.

    python build_tools/compare_sass.py BEFORE_DIR AFTER_DIR

Each directory holds the object files of one build (for the CUDA 12 line,
<build>/cuda12_objects/*.o). For every object file present in both, it
disassembles each fat binary's machine code (`cuobjdump -sass`; set CUOBJDUMP
or put it on the PATH, and nvdisasm beside it or NVDISASM_PATH), splits it by
architecture and kernel, and compares the instructions (addresses and
encodings included). Prints one line per object and architecture and exits
non-zero if any kernel differs, is missing, or is new. This is how a change
that should not touch device code (a launch macro, a host-side refactor)
shows that it did not.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ARCH = re.compile(r"^\s*code for (sm_\d+)", re.MULTILINE)
FUNCTION = re.compile(r"^\s*Function : (\S+)", re.MULTILINE)


def kernels_by_arch(cuobjdump: str, path: Path) -> dict[tuple[str, str], str]:
    """(architecture, mangled kernel name) -> its SASS text."""
    run = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True)
    if run.returncode != 0:
        if "does not contain device code" in run.stdout + run.stderr:
            return {}  # Host code only (gpu_common.cu).
        raise RuntimeError(f"cuobjdump -sass {path}: {run.stderr.strip()}")
    text = run.stdout
    result: dict[tuple[str, str], str] = {}
    arch_marks = [(m.start(), m.group(1)) for m in ARCH.finditer(text)]
    functions = list(FUNCTION.finditer(text))
    for index, match in enumerate(functions):
        end = functions[index + 1].start() if index + 1 < len(functions) else len(text)
        arch = next((a for start, a in reversed(arch_marks) if start < match.start()), "?")
        body = text[match.end() : end]
        # The next section's "code for" header, if any, is not the kernel's.
        body = ARCH.split(body, maxsplit=1)[0]
        result[(arch, match.group(1))] = body
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not cuobjdump:
        sys.exit("compare_sass: no cuobjdump (set CUOBJDUMP)")
    failed = False
    total = 0
    for before in sorted(args.before.glob("*.o")):
        after = args.after / before.name
        if not after.exists():
            print(f"{before.name}: missing in {args.after}")
            failed = True
            continue
        old = kernels_by_arch(cuobjdump, before)
        new = kernels_by_arch(cuobjdump, after)
        for arch in sorted({a for a, _ in old} | {a for a, _ in new}):
            old_names = {n for a, n in old if a == arch}
            new_names = {n for a, n in new if a == arch}
            same = sum(old[(arch, n)] == new[(arch, n)] for n in old_names & new_names)
            changed = len(old_names & new_names) - same
            gone, added = len(old_names - new_names), len(new_names - old_names)
            total += len(old_names)
            status = "identical" if changed == gone == added == 0 else "DIFFERS"
            failed |= status != "identical"
            print(
                f"{before.name} {arch}: {len(old_names)} kernels, {same} identical, "
                f"{changed} changed, {gone} gone, {added} new: {status}"
            )
    print(f"compare_sass: {total} kernel images compared: {'DIFFER' if failed else 'identical'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
