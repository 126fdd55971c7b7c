#!/usr/bin/env bash
# Builds the TF-free core's tests with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them; any report fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${SANITIZE_BUILD_DIR:-build/sanitize}"
mkdir -p "$out"
flags=(-std=c++17 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer
       -fno-sanitize-recover=all -Wall -Wextra -Werror -I. -pthread)
"${CXX:-g++}" "${flags[@]}" cc/core/masked_scatter_sub_cpu.cc tests/cc/core_test.cc \
  -o "$out/core_test"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/core_test"
