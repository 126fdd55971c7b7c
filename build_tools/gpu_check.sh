#!/usr/bin/env bash
# One call on a GPU machine (CUDA toolkit, CMake, pybind11, NumPy, CuPy or
# PyTorch; no TensorFlow needed): builds the pybind11 kernel module with CUDA,
# checks the GPU kernels against a float64 NumPy reference, times them against
# a device-to-device copy, and ends with a one-line summary. Exits non-zero on
# any correctness failure.
#
#   build_tools/gpu_check.sh [--quick] [--seed N] [--max-table-gb G]
#
# Environment: PE_CUDA_ARCHITECTURES (default: the GPU's own, "native"),
# PE_GPU_CHECK_BUILD_DIR (default: build/gpu_check), PYTHON (default: python3).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${PE_GPU_CHECK_BUILD_DIR:-${root}/build/gpu_check}"
module_dir="${build_dir}/module"
python="${PYTHON:-python3}"

architectures="${PE_CUDA_ARCHITECTURES:-}"
if [[ -z "${architectures}" ]]; then
  # "native" needs CMake >= 3.24; older CMake gets Hopper.
  cmake_version="$(cmake --version | head -n1 | awk '{print $3}')"
  if [[ "$(printf '%s\n3.24\n' "${cmake_version}" | sort -V | head -n1)" == "3.24" ]]; then
    architectures=native
  else
    architectures=90
  fi
fi

mkdir -p "${build_dir}"
start=${SECONDS}
cmake -S "${root}" -B "${build_dir}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DPE_BUILD_TF_OPS=OFF \
  -DPE_BUILD_KERNEL_MODULE=ON \
  -DPE_ENABLE_CUDA=ON \
  -DPE_CUDA_ARCHITECTURES="${architectures}" \
  -DPE_OUTPUT_DIR="${module_dir}" \
  -DPython3_EXECUTABLE="$(command -v "${python}")" >"${build_dir}/configure.log" 2>&1 \
  || { cat "${build_dir}/configure.log"; echo "gpu_check FAIL: CMake configure failed"; exit 1; }
cmake --build "${build_dir}" --target _kernels --parallel "$(nproc)" \
  || { echo "gpu_check FAIL: build failed"; exit 1; }
echo "gpu_check: built the kernel module for CUDA architectures ${architectures} in $((SECONDS - start)) s"

exec "${python}" "${root}/build_tools/gpu_check.py" --module-dir "${module_dir}" "$@"
