#!/usr/bin/env bash
# Compiles one stand-alone CUDA source (with its own main) on the SIMT
# emulator (cc/simt/README.md): simt.h forced in, the stand-in CUDA headers
# and the repository root on the include path, the emulator's runtime linked.
# ASan and UBSan are on unless SIMT_SANITIZE=0; the compiler is $CXX (g++).
#
#   build_tools/simt_compile.sh FILE.cu -o PROGRAM [extra compiler args]
#
# The runtime is built once per compiler and sanitizer setting, under
# ${SIMT_BUILD_DIR:-build/simt}, and rebuilt when cc/simt or this script
# changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 3 || "$2" != -o ]]; then
  echo "usage: $0 FILE.cu -o PROGRAM [extra compiler args]" >&2
  exit 2
fi
source_file="$1"
program="$3"
shift 3
cxx="${CXX:-g++}"
flags=(-std=c++17 -g -O1 -Wall -Wextra -Wno-unknown-pragmas -ffp-contract=off -pthread)
if [[ "${SIMT_SANITIZE:-1}" != 0 ]]; then
  # shellcheck source=build_tools/sanitizer_env.sh
  source "${root}/build_tools/sanitizer_env.sh"
  read -r -a sanitize_flags <<<"${PE_SANITIZE_FLAGS}"
  flags+=("${sanitize_flags[@]}")
fi
simt="${root}/cc/simt"

# The runtime, as a static library (kept apart from -include simt.h), at -O2:
# every lane and collective goes through it.
build_dir="${SIMT_BUILD_DIR:-${root}/build/simt}/$(basename "${cxx}")-san${SIMT_SANITIZE:-1}"
library="${build_dir}/libpe_simt.a"
mkdir -p "${build_dir}"
if [[ ! -f "${library}" || "${BASH_SOURCE[0]}" -nt "${library}" ]] ||
  [[ -n "$(find "${simt}" -maxdepth 2 -newer "${library}" \
      \( -name '*.cc' -o -name '*.h' \) -print -quit)" ]]; then
  lock="${build_dir}/.lock"
  (
    flock 9
    objects=()
    pids=()
    for runtime_source in "${simt}"/*.cc; do
      object="${build_dir}/$(basename "${runtime_source}" .cc).o"
      objects+=("${object}")
      "${cxx}" "${flags[@]}" -O2 -I "${simt}/include" -c "${runtime_source}" -o "${object}" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "${pid}"; done
    rm -f "${library}.tmp"
    ar rcs "${library}.tmp" "${objects[@]}"
    mv "${library}.tmp" "${library}"
  ) 9>"${lock}"
fi

"${cxx}" "${flags[@]}" -DPE_SIMT=1 -I "${simt}/include" -I "${root}" \
  -x c++ -include "${simt}/simt.h" "${source_file}" -x none "$@" \
  "${library}" -o "${program}"
