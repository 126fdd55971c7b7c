#!/usr/bin/env bash
# Builds the TF-free core's tests and the pybind11 kernel module with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs them; any report
# fails the script.
#
#   1. tests/cc/core_test.cc linked with the core, run directly (leak checks on).
#   2. The kernel module (_kernels) built by CMake without TensorFlow or CUDA
#      into its own build directory, and tests/test_kernel_module.py run
#      against it with the sanitizer runtimes preloaded into CPython. The test
#      imports the module from PE_KERNELS_MODULE_PATH, so neither the package
#      nor TensorFlow is imported. Leak checks are off there: CPython keeps
#      its interned objects until exit by design.
#
# SANITIZE_SKIP_MODULE=1 runs only step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${SANITIZE_BUILD_DIR:-build/sanitize}"
mkdir -p "$out"
sanitize_flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
flags=(-std=c++17 -O1 -g $sanitize_flags -Wall -Wextra -Werror -I. -pthread)
"${CXX:-g++}" "${flags[@]}" cc/core/parallel_for.cc cc/core/masked_scatter_sub_cpu.cc tests/cc/core_test.cc \
  -o "$out/core_test"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/core_test"

if [[ "${SANITIZE_SKIP_MODULE:-0}" == 1 ]]; then
  exit 0
fi

python="${PYTHON:-python3}"
module_build="$out/kernel_module"
module_dir="$module_build/out"
generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
# The compiler comes from CXX (as a -DCMAKE_CXX_COMPILER that differs from a
# cached one would make CMake drop the cache, and these options with it).
CXX="${CXX:-g++}" cmake -S . -B "$module_build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O1 -g $sanitize_flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DPython3_EXECUTABLE="$(command -v "$python")" \
  -DPE_BUILD_TF_OPS=OFF -DPE_BUILD_KERNEL_MODULE=ON -DPE_ENABLE_CUDA=OFF \
  -DPE_OUTPUT_DIR="$(pwd)/$module_dir" >"$module_build.configure.log" 2>&1 ||
  { cat "$module_build.configure.log"; exit 1; }
cmake --build "$module_build" --target _kernels -j "${SANITIZE_JOBS:-2}"
module=$(ls "$module_dir"/_kernels*.so)

# The interpreter itself is not instrumented: the runtimes must come first.
preload="$("${CXX:-g++}" -print-file-name=libasan.so):$("${CXX:-g++}" -print-file-name=libubsan.so)"
log_dir="$out/module_reports"
rm -rf "$log_dir" && mkdir -p "$log_dir"
# PYTHONMALLOC=malloc lets ASan see Python's own allocations.
env LD_PRELOAD="$preload" PYTHONMALLOC=malloc \
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$log_dir/asan" \
  UBSAN_OPTIONS="print_stacktrace=1:log_path=$log_dir/ubsan" \
  PE_KERNELS_MODULE_PATH="$(pwd)/$module" TF_CPP_MIN_LOG_LEVEL=3 \
  "$python" -m pytest -q -p no:cacheprovider tests/test_kernel_module.py
if compgen -G "$log_dir/*" >/dev/null; then
  echo "sanitizer reports from the kernel module tests:" >&2
  cat "$log_dir"/* >&2
  exit 1
fi
echo "sanitize.sh: core test and kernel module tests clean under ASan+UBSan"
