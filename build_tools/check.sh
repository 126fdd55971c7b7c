#!/usr/bin/env bash
# Quality gates: formatting, lint, types and runnable docs. Fails on any
# finding.
#   build_tools/check.sh           everything (the package must be installed)
#   build_tools/check.sh --static  everything but the runnable docs, which need
#                                  the built package (CI runs them with the tests)
#   build_tools/check.sh --fix     applies the formatters instead
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3

cxx_files=$(git ls-files 'cc/*.cc' 'cc/*.h' 'cc/*.cu' 'cc/*.cuh' 'tests/cc/*.cc' 'tests/cc/*.h')
status=0
run() {
  echo "== $*"
  "$@" || status=1
}

if [[ "${1:-}" == "--fix" ]]; then
  ruff check --fix .
  ruff format .
  # shellcheck disable=SC2086
  clang-format -i $cxx_files
  exit 0
fi

run ruff check .
run ruff format --check .
run mypy
# shellcheck disable=SC2086
run clang-format --dry-run --Werror $cxx_files
run python build_tools/house_metrics.py --check
if [[ "${1:-}" != "--static" ]]; then
  run python -m pytest -q -p no:cacheprovider -n 0 tests/package/test_docs.py
fi
if [[ $status -ne 0 ]]; then
  echo "check.sh: findings above; 'bash build_tools/check.sh --fix' fixes formatting" >&2
fi
exit $status
