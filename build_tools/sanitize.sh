#!/usr/bin/env bash
# Builds the TF-free core's tests and the pybind11 kernel module with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs them; any report
# fails the script. One CMake build (no TensorFlow, no CUDA), so the core
# compiles with the same per-file flags as in the wheel.
#
#   1. tests/cc/core_test.cc (both CPU cores, their parallel-for, huge pages,
#      the 16-bit conversions) linked with the core, run directly, leak
#      checks on.
#   2. The kernel module (_kernels), and tests/ops/test_kernel_module.py run
#      against it with the sanitizer runtimes preloaded into CPython. The test
#      imports the module from PE_KERNELS_MODULE_PATH, so neither the package
#      nor TensorFlow is imported. Leak checks are off there: CPython keeps
#      its interned objects until exit by design. The module is built with
#      PE_SIMT=ON: its CUDA entry points run the CUDA core on the SIMT
#      emulator (cc/simt/), so `SIMT_MODULE_DIR=build/sanitize/module
#      build_tools/gpu_check.sh --simt` checks the CUDA kernels under the
#      sanitizers with this same build (CI does).
#
# The core builds at -O1, as the sanitizers advise; the test driver and the
# module's pybind11 glue at -O0, where AddressSanitizer checks every access
# all the same and they compile in a third to a half of the time (core_test.cc
# 4.7 s instead of 18.8 s, kernels_bags.cc 9.4 s instead of 17.2 s; UBSan's
# object-size check, which needs optimization, stays on the core).
#
# SANITIZE_SKIP_MODULE=1 runs only step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${SANITIZE_BUILD_DIR:-build/sanitize}")
mkdir -p "$out"
# shellcheck source=build_tools/sanitizer_env.sh
source build_tools/sanitizer_env.sh
sanitize_flags="${PE_SANITIZE_FLAGS}"
python="${PYTHON:-python3}"
module_dir="$out/module"
with_module=ON
targets=(core_test _kernels)
if [[ "${SANITIZE_SKIP_MODULE:-0}" == 1 ]]; then
  with_module=OFF
  targets=(core_test)
fi
generator=()
if command -v ninja >/dev/null 2>&1 && [[ ! -f "$out/CMakeCache.txt" ]]; then
  generator=(-G Ninja)
fi
# The compiler comes from CXX (as a -DCMAKE_CXX_COMPILER that differs from a
# cached one would make CMake drop the cache, and these options with it).
CXX="${CXX:-g++}" cmake -S . -B "$out" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O0 -g $sanitize_flags" -DPE_CORE_COMPILE_OPTIONS=-O1 \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DPython3_EXECUTABLE="$(command -v "$python")" \
  -DPE_BUILD_TF_OPS=OFF -DPE_BUILD_KERNEL_MODULE="$with_module" \
  -DPE_BUILD_CORE_TEST=ON -DPE_WERROR=ON -DPE_ENABLE_CUDA=OFF -DPE_SIMT="$with_module" \
  -DPE_OUTPUT_DIR="$module_dir" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build "$out" --target "${targets[@]}" -j "${SANITIZE_JOBS:-2}"

ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/core_test"

if [[ "$with_module" == OFF ]]; then
  exit 0
fi

module=$(ls "$module_dir"/_kernels*.so)
log_dir="$out/module_reports"
rm -rf "$log_dir" && mkdir -p "$log_dir"
# The interpreter itself is not instrumented (build_tools/sanitizer_env.sh).
pe_sanitized_python_env "$log_dir"
env "${PE_SANITIZED_RUN_ENV[@]}" \
  PE_KERNELS_MODULE_PATH="$module" TF_CPP_MIN_LOG_LEVEL=3 \
  "$python" -m pytest -q -p no:cacheprovider -n 0 tests/ops/test_kernel_module.py
if compgen -G "$log_dir/*" >/dev/null; then
  echo "sanitizer reports from the kernel module tests:" >&2
  cat "$log_dir"/* >&2
  exit 1
fi
echo "sanitize.sh: core test and kernel module tests clean under ASan+UBSan"
