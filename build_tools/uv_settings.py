"""Prints `export` lines that give uv the package sources pip is set up with.

CI installs with uv where it can (the same packages, several times faster on
two cores: .ci/run measured 49 s against 12 s for the test environment), and
uv reads no pip configuration. This hands it pip's: the index and extra
indexes, find-links, constraints and the CA certificate, each from the place
pip itself would take it (environment over user over site over global file).
pip's way of choosing among indexes (the best version on any of them) is
kept with uv's `unsafe-best-match`, and so is pip's compiling of every
module's bytecode at install.

    eval "$(python build_tools/uv_settings.py)"
"""

from __future__ import annotations

import shlex
import subprocess
import sys

#: pip option -> (uv variable, separator uv expects between values).
UV_VARIABLES = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", None),
}

#: pip's precedence, last wins.
ORIGINS = ("global", "site", "user", ":env:")


def pip_settings() -> dict[str, str]:
    """pip's settings by option name, the one pip would use of each."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        origin, _, option = key.rpartition(".")
        found.setdefault(option, {})[origin] = value.strip().strip("'\"")
    settings = {}
    for option, by_origin in found.items():
        for origin in ORIGINS:
            if origin in by_origin:
                settings[option] = by_origin[origin]
    return settings


def main() -> None:
    settings = pip_settings()
    print("export UV_INDEX_STRATEGY=unsafe-best-match")
    # pip writes each module's bytecode as it installs; uv only when asked.
    # Without it, where PYTHONDONTWRITEBYTECODE is set (this machine sets
    # it), every process compiled TensorFlow's and Keras' sources again on
    # import, about 5 s each: CI's test steps took minutes longer.
    print("export UV_COMPILE_BYTECODE=1")
    for option, (variable, separator) in UV_VARIABLES.items():
        value = settings.get(option)
        if not value:
            continue
        if separator is not None:
            value = separator.join(value.split())
        print(f"export {variable}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
