#!/usr/bin/env bash
# Prints the CPython interpreters of the versions asked for that this machine
# has, one path a line, in the order asked; says on stderr which it lacks.
#
#   bash build_tools/find_pythons.sh 3.10 3.12 3.13
#
# Looks for pythonX.Y on PATH, then in pyenv's versions folder
# (${PYENV_ROOT:-~/.pyenv}/versions/X.Y.*: pyenv's shims answer only for the
# selected versions). No package index ships CPython builds that install here
# (uv's and pyenv's own downloads come from hosts outside the package indexes),
# so a version this machine lacks is left out, not fetched.
set -uo pipefail
pyenv_root="${PYENV_ROOT:-${HOME}/.pyenv}"
for version in "$@"; do
  found=""
  for candidate in "$(command -v "python${version}" 2>/dev/null)" \
    "${pyenv_root}"/versions/"${version}".*/bin/"python${version}"; do
    [[ -n "${candidate}" && -x "${candidate}" ]] || continue
    if [[ "$("${candidate}" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" == "${version}" ]]; then
      found="${candidate}"
      break
    fi
  done
  if [[ -n "${found}" ]]; then
    echo "${found}"
  else
    echo "find_pythons.sh: no Python ${version} here" >&2
  fi
done
