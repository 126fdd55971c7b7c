#!/usr/bin/env bash
# Compiles and links the nvcc (CUDA toolkit) build for sm_90 without running
# it, the alternative to the default CUDA 12 line (.ci/run builds that): the
# TensorFlow op library with its GPU kernels, the XLA custom-call library with
# its CUDA handlers, and the pybind11 kernel module with CUDA. Fails on any compile or link error, and if the op library binds
# to a CUDA runtime outside itself (it must not use TensorFlow's).
#
#   build_tools/ci_cuda_compile.sh [build-dir]   (default: build/ci_cuda)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-${root}/build/ci_cuda}"
out_dir="${build_dir}/out"
python="${PYTHON:-python3}"

if ! command -v nvcc >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "ci_cuda_compile: no nvcc found" >&2
  exit 1
fi

start=${SECONDS}
cmake -S "${root}" -B "${build_dir}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DPE_ENABLE_CUDA=ON \
  -DPE_CUDA_TOOLCHAIN=nvcc \
  -DPE_CUDA_ARCHITECTURES=90 \
  -DPE_BUILD_TF_OPS=ON \
  -DPE_BUILD_KERNEL_MODULE=ON \
  -DPE_ENABLE_XLA_FFI=ON \
  -DPE_OUTPUT_DIR="${out_dir}" \
  -DPython3_EXECUTABLE="$(command -v "${python}")"
cmake --build "${build_dir}" --parallel "${PE_BUILD_JOBS:-2}"

ops="${out_dir}/_partial_embedding_ops.so"
module="$(ls "${out_dir}"/_kernels*.so)"
"${root}/build_tools/check_cuda_symbols.sh" "${ops}" "${module}"
if command -v cuobjdump >/dev/null 2>&1 && ! cuobjdump --list-elf "${ops}" | grep -q sm_90; then
  echo "ci_cuda_compile: no sm_90 code in ${ops}" >&2
  exit 1
fi
echo "ci_cuda_compile: OK, CUDA code compiled and linked for sm_90 in $((SECONDS - start)) s"
