#!/usr/bin/env bash
# The one command of the GPU check's suite (build_tools/gpu_check.py with
# gpu_check_rules.py, gpu_check_lookup.py, gpu_check_bags.py): one reference
# per kernel (MaskedScatterSub, every rule of the fused optimizer table, the
# quantized lookup, the bag gradient), run in three places:
#   gpu_check.sh --simt             CI, no GPU: the module on the SIMT emulator;
#   gpu_check.sh                    a GPU, no TensorFlow: the TF-free module;
#   gpu_check.sh --tensorflow-ops   a GPU, through the package's TensorFlow ops.
# Timing stays with the module run (and with --tensorflow, the bench).
#
# Without a flag, one call on a GPU machine (CMake, pybind11, NumPy, CuPy or
# PyTorch; no TensorFlow needed): builds the pybind11 kernel module with the
# GPU kernels, reads its device code (build_tools/check_cuda_binaries.py),
# runs the suite against NumPy and the CPU kernels, times the kernels
# (MaskedScatterSub against a device-to-device copy, the Adam rule against
# its memory floor, PyTorch's SparseAdam and stock ops, every rule against its
# floor), and writes the
# findings as JSON. Exits non-zero on any correctness failure.
#
#   build_tools/gpu_check.sh [--quick] [--seed N|random] [--max-table-gb G]
#
# The toolchain is the wheel's default GPU build, the CUDA 12 line (clang with
# CUDA 12.5 headers, ptxas 12.5, libcudart.so.12; see CMakeLists.txt), where
# its pieces can be had:
#   * clang++ (clang-19) on the PATH, or PE_CLANG_CUDA_COMPILER;
#   * ptxas/libdevice, CUB and libcudart.so.12 from the nvidia-cuda-nvcc-cu12,
#     nvidia-cuda-cccl-cu12 and nvidia-cuda-runtime-cu12 wheels (12.5): taken
#     from the Python environment, else pip-installed into the build directory
#     when the package index can be reached;
#   * CUDA 12.5 headers: the TensorFlow wheel's copy, or PE_CUDA12_INCLUDE_DIR
#     (the cu12 wheels alone lack crt/).
# A machine without them (the lent GPU machine has no TensorFlow, no clang and
# no network) gets the machine's own nvcc and CUDA toolkit instead, and the
# script says so on its first line and in the JSON ("toolchain"): the kernels
# are then checked, but not the CUDA 12 binaries the wheel ships.
# PE_GPU_CHECK_TOOLCHAIN=clang12 or nvcc forces one.
#
#   build_tools/gpu_check.sh --tensorflow-ops [--device /GPU:0] [--quick] [--seed N] ...
#
# runs the same suite through the installed package's TensorFlow ops on
# variables on the device (no build; python build_tools/gpu_check.py
# --tensorflow-ops; --device /CPU:0 runs it through the CPU op kernels).
#
#   build_tools/gpu_check.sh --tensorflow [--no-timing] [--seed N] ...
#
# checks the installed package through TensorFlow on the GPU instead (no
# build): the smoke check of the first training step,
# `python -m partial_embedding.bench --gpu-step` (fit with jit_compile auto
# and False, int8 frozen rows, a tied LM under XLA, variable placement, and
# our step time against stock Keras at V = 1M and 8M); the flags after
# --tensorflow are its own.
#
#   build_tools/gpu_check.sh --simt [--seeds LIST] [--quick] ...
#
# runs the same checks without a GPU, on the SIMT emulator (cc/simt/): the
# kernel module is built with PE_SIMT=ON (the CUDA core's unchanged sources
# compiled as host C++; no CUDA toolchain), under ASan and UBSan unless
# SIMT_SANITIZE=0, and build_tools/gpu_check.py --simt runs once per seed of
# LIST (comma-separated integers or "random", a fresh printed one; default
# 0,1,2). A seed draws both the inputs and the emulator's schedules
# (PE_SIMT_SEED). Each run reports the launches and checks per kernel of
# cc/core and fails where a kernel never ran; its JSON goes to
# gpu_check_simt_<seed>.json in $OUT or the build directory
# (PE_GPU_CHECK_BUILD_DIR, default build/gpu_check_simt).
#
# Environment: PE_CUDA_ARCHITECTURES (default: 75-real;80-real;90 with clang12,
# the GPU's own with nvcc), PE_GPU_CHECK_BUILD_DIR (default build/gpu_check),
# PE_GPU_CHECK_JSON (default: $OUT/gpu_check.json when OUT is set, else
# <build dir>/gpu_check.json), PYTHON (default python3).
set -euo pipefail

if [[ "${1:-}" == --tensorflow ]]; then
  shift
  exec "${PYTHON:-python3}" -m partial_embedding.bench --gpu-step "$@"
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${1:-}" == --tensorflow-ops ]]; then
  shift
  exec "${PYTHON:-python3}" "${root}/build_tools/gpu_check.py" --tensorflow-ops "$@"
fi

if [[ "${1:-}" == --simt ]]; then
  shift
  seeds="0,1,2"
  forwarded=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --seeds) seeds="$2"; shift 2 ;;
      --seed) seeds="$2"; shift 2 ;;
      *) forwarded+=("$1"); shift ;;
    esac
  done
  exec bash "${root}/build_tools/simt_gpu_check.sh" "${seeds}" "${forwarded[@]}"
fi

build_dir="${PE_GPU_CHECK_BUILD_DIR:-${root}/build/gpu_check}"
module_dir="${build_dir}/module"
python="${PYTHON:-python3}"
if [[ -n "${OUT:-}" ]]; then
  json="${PE_GPU_CHECK_JSON:-${OUT}/gpu_check.json}"
else
  json="${PE_GPU_CHECK_JSON:-${build_dir}/gpu_check.json}"
fi
toolchain="${PE_GPU_CHECK_TOOLCHAIN:-auto}"
mkdir -p "${build_dir}"
start=${SECONDS}

# --- the CUDA 12 line's pieces ----------------------------------------------
cuda12_site="${build_dir}/cuda12_site"
cuda12_missing=""
have_python_package() {
  PYTHONPATH="${cuda12_site}${PYTHONPATH:+:${PYTHONPATH}}" "${python}" -c \
    "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null
}
find_cuda12_pieces() {
  cuda12_missing=""
  clang="${PE_CLANG_CUDA_COMPILER:-$(command -v clang++-19 || command -v clang++ || true)}"
  [[ -n "${clang}" && -x "${clang}" ]] || cuda12_missing+=" clang++;"
  if [[ -z "${PE_CUDA12_INCLUDE_DIR:-}" ]] && ! have_python_package tensorflow; then
    cuda12_missing+=" CUDA 12.5 headers (TensorFlow's copy, or PE_CUDA12_INCLUDE_DIR);"
  fi
  for package in nvidia.cuda_nvcc nvidia.cuda_cccl nvidia.cuda_runtime; do
    have_python_package "${package}" || cuda12_missing+=" ${package};"
  done
}
if [[ "${toolchain}" != nvcc ]]; then
  find_cuda12_pieces
  if [[ "${cuda12_missing}" == *nvidia.* ]]; then
    # The wheels are small; try the package index once, quietly.
    # Without network this fails within seconds (no retries, short timeout).
    timeout 120 "${python}" -m pip install -q --disable-pip-version-check --no-deps \
      --retries 0 --timeout 5 \
      --target "${cuda12_site}" "nvidia-cuda-nvcc-cu12==12.5.*" \
      "nvidia-cuda-cccl-cu12==12.5.*" "nvidia-cuda-runtime-cu12==12.5.*" \
      >"${build_dir}/pip.log" 2>&1 || true
    find_cuda12_pieces
  fi
  if [[ -z "${cuda12_missing}" ]]; then
    toolchain=clang12
  elif [[ "${toolchain}" == clang12 ]]; then
    echo "gpu_check FAIL: the CUDA 12 line lacks:${cuda12_missing}"
    exit 1
  else
    toolchain=nvcc
    echo "gpu_check: NOTE: the CUDA 12 line lacks:${cuda12_missing} so this run builds" \
      "with the machine's nvcc instead: it checks the kernels, not the CUDA 12 binaries" \
      "the wheel ships"
  fi
fi

# --- configure and build -------------------------------------------------------
cmake_args=(
  -DCMAKE_BUILD_TYPE=Release
  -DPE_BUILD_TF_OPS=OFF
  -DPE_BUILD_KERNEL_MODULE=ON
  -DPE_ENABLE_CUDA=ON
  -DPE_KERNEL_MODULE_CUDA=ON
  -DPE_CUDA_TOOLCHAIN="${toolchain}"
  -DPE_OUTPUT_DIR="${module_dir}"
  -DPython3_EXECUTABLE="$(command -v "${python}")"
)
if [[ "${toolchain}" == clang12 ]]; then
  architectures="${PE_CUDA_ARCHITECTURES:-75-real;80-real;90}"
  cmake_args+=(-DPE_CLANG_CUDA_COMPILER="${clang}")
  if [[ -n "${PE_CUDA12_INCLUDE_DIR:-}" ]]; then
    cmake_args+=(-DPE_CUDA12_INCLUDE_DIR="${PE_CUDA12_INCLUDE_DIR}")
  fi
  export PYTHONPATH="${cuda12_site}${PYTHONPATH:+:${PYTHONPATH}}"
else
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
fi
cmake_args+=(-DPE_CUDA_ARCHITECTURES="${architectures}")

cmake -S "${root}" -B "${build_dir}" "${cmake_args[@]}" >"${build_dir}/configure.log" 2>&1 \
  || { cat "${build_dir}/configure.log"; echo "gpu_check FAIL: CMake configure failed"; exit 1; }
cmake --build "${build_dir}" --target _kernels --parallel "$(nproc)" \
  || { echo "gpu_check FAIL: build failed"; exit 1; }
build_seconds=$((SECONDS - start))
echo "gpu_check: built the kernel module with ${toolchain} for CUDA architectures" \
  "${architectures} in ${build_seconds} s"

# --- what was built, and its binaries ------------------------------------------
module="$(ls "${module_dir}"/_kernels*.so)"
binary_check=passed
"${python}" "${root}/build_tools/check_cuda_binaries.py" "${module}" \
  --json "${build_dir}/binaries.json" || binary_check=failed
if [[ "${toolchain}" == clang12 && "${binary_check}" == failed ]]; then
  echo "gpu_check FAIL: the CUDA 12 build's binaries need more than CUDA 12.5"
  exit 1
fi
"${python}" - "${build_dir}" "${toolchain}" "${architectures}" "${binary_check}" \
  "${build_seconds}" <<'PY'
import json, re, sys
from pathlib import Path

build_dir, toolchain, architectures, binary_check, seconds = sys.argv[1:]
cache = (Path(build_dir) / "CMakeCache.txt").read_text()


def cached(name):
    match = re.search(rf"^{name}:[A-Z]+=(.*)$", cache, re.MULTILINE)
    return match.group(1) if match else None


info = {
    "toolchain": toolchain,
    "wheel_default_toolchain": toolchain == "clang12",
    "architectures": architectures,
    "build_seconds": int(seconds),
    "binary_check": binary_check,
    "binaries": json.loads((Path(build_dir) / "binaries.json").read_text()),
}
if toolchain == "clang12":
    info.update(
        compiler=cached("PE_CLANG_CUDA_COMPILER"),
        headers=cached("PE_CUDA12_INCLUDE_DIR"),
        ptxas_dir=cached("PE_CUDA12_NVCC_DIR"),
    )
else:
    info.update(compiler=cached("CMAKE_CUDA_COMPILER"))
(Path(build_dir) / "build_info.json").write_text(json.dumps(info, indent=2))
PY

mkdir -p "$(dirname "${json}")"
exec "${python}" "${root}/build_tools/gpu_check.py" --module-dir "${module_dir}" \
  --build-info "${build_dir}/build_info.json" --json "${json}" "$@"
