#!/usr/bin/env bash
# The XLA custom calls' CUDA handlers, run end to end without a GPU: builds
# the XLA custom-call library on the SIMT emulator (cc/simt), where the CUDA
# handlers' code (cc/xla/masked_row_updates_gpu_ffi.cc: FFI decoding,
# aliasing, the workspace, the stream, the CUDA core's kernels) is registered
# for XLA's Host platform in place of the CPU handlers, then runs the custom
# calls' tests with that library loaded (PARTIAL_EMBEDDING_XLA_LIBRARY): XLA
# on the CPU compiles our ops into custom calls and runs the emulated CUDA
# code, which is compared with the CPU kernel (bits, or the row-wise rules'
# bound), with bad ids among the positions, on each seed of --seeds.
#
#   build_tools/simt_xla_check.sh [--seeds 0,random] [build-dir]
#
# Needs the package installed (its op library and TensorFlow) in the current
# Python; no CUDA toolchain. A seed drives the emulator's schedule
# (PE_SIMT_SEED) and the tests' inputs (PE_TEST_SEED); "random" draws one and
# prints it. .ci/run calls it with a fixed and a fresh seed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seeds="0"
if [[ "${1:-}" == "--seeds" ]]; then
  seeds="$2"
  shift 2
fi
build_dir="${1:-${root}/build/simt_xla}"
out_dir="${build_dir}/out"
python="${PYTHON:-python}"

start=${SECONDS}
mkdir -p "${build_dir}"
cmake -S "${root}" -B "${build_dir}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DPE_ENABLE_CUDA=OFF -DPE_SIMT=ON -DPE_ENABLE_XLA_FFI=ON \
  -DPE_BUILD_TF_OPS=OFF -DPE_BUILD_KERNEL_MODULE=OFF \
  -DPE_CORE_COMPILE_OPTIONS=-O1 -DPE_WERROR=ON \
  -DPython3_EXECUTABLE="$(command -v "${python}")" \
  -DPE_OUTPUT_DIR="${out_dir}" >"${build_dir}/configure.log" 2>&1 ||
  { cat "${build_dir}/configure.log"; exit 1; }
cmake --build "${build_dir}" --target _partial_embedding_xla -j "${SIMT_XLA_JOBS:-2}"
library="${out_dir}/_partial_embedding_xla.so"
echo "simt_xla_check: built ${library} in $((SECONDS - start)) s"

# The custom calls' own tests, and MaskedOptimizer steps under XLA that go
# through them: every rule in one compiled loop, a row-wise rule in fit with
# compact slots, and bad ids in a compiled step (each against the kernel path).
tests=(tests/ops/test_xla_custom_call.py tests/ops/test_xla_custom_call_slots.py
  tests/ops/test_xla_handlers.py
  "tests/ops/test_xla.py::test_custom_xla_loop_matches_the_kernel_path_for_every_rule[float32]"
  "tests/ops/test_xla.py::test_fit_with_xla_matches_the_kernel_path[rowwise_adam_decay-compact-float32]"
  "tests/ops/test_xla.py::test_a_bad_id_under_xla_moves_no_row[40]")
for seed in ${seeds//,/ }; do
  if [[ "${seed}" == "random" ]]; then
    seed=$(( (RANDOM << 15 | RANDOM) % 2147483647 ))
  fi
  echo "simt_xla_check: seed ${seed} (rerun: build_tools/simt_xla_check.sh --seeds ${seed})"
  # The library must report the emulator build, or the run checked nothing new.
  (cd "${root}" && PARTIAL_EMBEDDING_XLA_LIBRARY="${library}" PE_SIMT_SEED="${seed}" \
    PE_TEST_SEED="${seed}" PE_EXPECT_XLA_HANDLERS=simt \
    "${python}" -m pytest -q -p no:cacheprovider -n 0 "${tests[@]}")
done
echo "simt_xla_check: done in $((SECONDS - start)) s"
