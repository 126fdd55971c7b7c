#!/usr/bin/env bash
# The body of `build_tools/gpu_check.sh --simt` (see there): builds the kernel
# module on the SIMT emulator and runs build_tools/gpu_check.py --simt once
# per seed.
#
#   build_tools/simt_gpu_check.sh SEEDS [gpu_check.py flags...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=build_tools/sanitizer_env.sh
source "${root}/build_tools/sanitizer_env.sh"
seeds="$1"
shift
python="${PYTHON:-python3}"
build_dir="${PE_GPU_CHECK_BUILD_DIR:-${root}/build/gpu_check_simt}"
module_dir="${build_dir}/module"
json_dir="${OUT:-${build_dir}}"
mkdir -p "${build_dir}" "${json_dir}"
start=${SECONDS}

compiler="${CXX:-g++}"
sanitize="${SIMT_SANITIZE:-1}"
if [[ -n "${SIMT_MODULE_DIR:-}" ]]; then
  # A module built already (build_tools/sanitize.sh builds it under ASan and
  # UBSan with PE_SIMT=ON; SIMT_SANITIZE says how it was built).
  module_dir="${SIMT_MODULE_DIR}"
  echo "gpu_check --simt: the kernel module in ${module_dir}"
else
  flags="-O1 -g"
  if [[ "${sanitize}" == 1 ]]; then
    flags+=" ${PE_SANITIZE_FLAGS}"
  fi
  generator=()
  if command -v ninja >/dev/null 2>&1 && [[ ! -f "${build_dir}/CMakeCache.txt" ]]; then
    generator=(-G Ninja)
  fi
  CXX="${compiler}" cmake -S "${root}" -B "${build_dir}" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="${flags}" \
    -DCMAKE_MODULE_LINKER_FLAGS="${flags}" \
    -DPython3_EXECUTABLE="$(command -v "${python}")" \
    -DPE_BUILD_TF_OPS=OFF -DPE_BUILD_KERNEL_MODULE=ON -DPE_ENABLE_CUDA=OFF \
    -DPE_SIMT=ON -DPE_WERROR=ON -DPE_OUTPUT_DIR="${module_dir}" \
    >"${build_dir}/configure.log" 2>&1 \
    || { cat "${build_dir}/configure.log"; echo "gpu_check --simt FAIL: CMake configure failed"; exit 1; }
  cmake --build "${build_dir}" --target _kernels --parallel "${SIMT_JOBS:-$(nproc)}" \
    || { echo "gpu_check --simt FAIL: build failed"; exit 1; }
  echo "gpu_check --simt: built the kernel module on the SIMT emulator" \
    "($([[ "${sanitize}" == 1 ]] && echo "ASan + UBSan" || echo "no sanitizers"))" \
    "in $((SECONDS - start)) s"
fi

run_env=(PE_SIMT_ABORT=0)
if [[ "${sanitize}" == 1 ]]; then
  # The interpreter is not instrumented (build_tools/sanitizer_env.sh).
  pe_sanitized_python_env
  run_env+=("${PE_SANITIZED_RUN_ENV[@]}")
fi
# One run per seed, as many at once as there are cores (SIMT_JOBS; each run
# is one thread); their logs are printed in seed order.
resolved=()
for seed in ${seeds//,/ }; do
  if [[ "${seed}" == random ]]; then
    seed=$("${python}" -c "import secrets; print(secrets.randbelow(2**32))")
  fi
  resolved+=("${seed}")
done
jobs_at_once="${SIMT_JOBS:-$(nproc)}"
status=0
for ((first = 0; first < ${#resolved[@]}; first += jobs_at_once)); do
  batch=("${resolved[@]:first:jobs_at_once}")
  pids=()
  for seed in "${batch[@]}"; do
    env "${run_env[@]}" PE_SIMT_SEED="${seed}" "${python}" "${root}/build_tools/gpu_check.py" \
      --module-dir "${module_dir}" --simt --seed "${seed}" \
      --json "${json_dir}/gpu_check_simt_${seed}.json" "$@" \
      >"${build_dir}/gpu_check_simt_${seed}.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!batch[@]}"; do
    seed_status=0
    wait "${pids[i]}" || seed_status=$?
    echo "gpu_check --simt: PE_SIMT_SEED=${batch[i]} (exit ${seed_status})"
    cat "${build_dir}/gpu_check_simt_${batch[i]}.log"
    [[ ${seed_status} -eq 0 ]] || status=${seed_status}
  done
done
exit "${status}"
