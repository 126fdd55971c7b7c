#!/usr/bin/env bash
# Fails if a built library imports or exports a CUDA runtime symbol: the static
# CUDA runtime must stay private to our libraries, so that they never bind to
# the CUDA 12 runtime stub that libtensorflow_framework exports.
#
#   build_tools/check_cuda_symbols.sh LIBRARY...
set -euo pipefail
for library in "$@"; do
  if nm -D "${library}" | grep -E ' (U|T) (cuda|__cuda)'; then
    echo "check_cuda_symbols: ${library} exposes CUDA runtime symbols" >&2
    exit 1
  fi
done
echo "check_cuda_symbols: no CUDA runtime symbol exposed by $# libraries"
