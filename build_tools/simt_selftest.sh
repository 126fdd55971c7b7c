#!/usr/bin/env bash
# The SIMT emulator's own tests (cc/simt/tests/): every case that keeps
# CUDA's rules must pass on PE_SIMT_SEED=1..50, and every case that breaks one
# must be reported (a "simt:" line or a sanitizer's report, and a non-zero
# exit). An invalid memory access in a lane must kill the process with the
# signal after a "simt:" line naming the lane (without sanitizers; with them,
# ASan's report and a "simt:" line). Then the speed check, once, without
# sanitizers.
#
#   build_tools/simt_selftest.sh      (CXX picks the compiler, g++ by default)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=${SECONDS}
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
seeds=(1 50)

# ASan must see the shared-memory overflow itself: UBSan's object-size check
# would report it first. -O0: the cases are small, and it compiles in 9 s
# instead of 21 (ASan and UBSan check every access all the same).
"${root}/build_tools/simt_compile.sh" "${root}/cc/simt/tests/simt_cases.cu" \
  -o "${work}/simt_cases" -fno-sanitize=object-size -O0 &
cases_build=$!
SIMT_SANITIZE=0 "${root}/build_tools/simt_compile.sh" "${root}/cc/simt/tests/simt_speed.cu" \
  -o "${work}/simt_speed" -O2 &
speed_build=$!
SIMT_SANITIZE=0 "${root}/build_tools/simt_compile.sh" "${root}/cc/simt/tests/simt_fault_signal.cu" \
  -o "${work}/simt_fault_signal" &
signal_build=$!
signal_sanitized_build=
if [[ "${SIMT_SANITIZE:-1}" != 0 ]]; then
  "${root}/build_tools/simt_compile.sh" "${root}/cc/simt/tests/simt_fault_signal.cu" \
    -o "${work}/simt_fault_signal_sanitized" &
  signal_sanitized_build=$!
fi
wait "${cases_build}" || { echo "simt selftest: building simt_cases failed"; exit 1; }
wait "${speed_build}" || { echo "simt selftest: building simt_speed failed"; exit 1; }
wait "${signal_build}" || { echo "simt selftest: building simt_fault_signal failed"; exit 1; }
if [[ -n "${signal_sanitized_build}" ]]; then
  wait "${signal_sanitized_build}" ||
    { echo "simt selftest: building simt_fault_signal with sanitizers failed"; exit 1; }
fi
echo "simt selftest: built in $((SECONDS - start)) s with ${CXX:-g++}"

passed=0
failed=0
report() {  # NAME OK DETAIL
  if [[ "$2" == 1 ]]; then
    passed=$((passed + 1))
    echo "PASS $1: $3"
  else
    failed=$((failed + 1))
    echo "FAIL $1: $3"
  fi
}

# Correct cases: all 50 seeds in one process each.
for name in reduce_ok shuffle_partial_mask_ok mask_live_lanes_ok shared_in_bounds_ok \
    aligned_load_ok synchronized_read_ok sort_current_ok warp_collectives_ok atomics_ok \
    dynamic_shared_ok cub_reference_ok runtime_api_ok; do
  case_start=${SECONDS}
  if "${work}/simt_cases" "${name}" "${seeds[@]}" >"${work}/${name}.log" 2>&1; then
    report "${name}" 1 "seeds ${seeds[0]}-${seeds[1]} ($((SECONDS - case_start)) s)"
  else
    report "${name}" 0 "$(grep -v -E 'expected|not in one device|DeadlockKernel' "${work}/${name}.log" \
      | grep -m1 -E 'simt:|ERROR|runtime error')"
  fi
done

# Broken cases, each in its own process (seeds tried until one reports):
# name, then the report expected (an extended regular expression).
broken=(
  "reduce_missing_barrier|simt: block sum"
  "shuffle_full_mask_in_branch|simt: kernel HalfWarpShuffleKernel .*__shfl_sync.*threads 16-31, which exited"
  "mask_names_exited_lane|simt: kernel ExitedLanesKernel .*threads 20-31, which exited"
  "shared_past_array|AddressSanitizer: global-buffer-overflow"
  "misaligned_load|runtime error: .*misaligned address"
  "unsynchronized_read|simt: read back"
  "sort_buffer_passed_in|simt: keys not sorted"
  "deadlock|simt: kernel DeadlockKernel .*deadlock: .*__shfl_sync.*__syncwarp"
  "barrier_after_exit|simt: kernel BarrierAfterExitKernel .*__syncthreads .* threads 48-63 exited"
)
for entry in "${broken[@]}"; do
  name="${entry%%|*}"
  pattern="${entry#*|}"
  if [[ "${SIMT_SANITIZE:-1}" == 0 && "${name}" =~ ^(shared_past_array|misaligned_load)$ ]]; then
    continue
  fi
  "${work}/simt_cases" "${name}" "${seeds[@]}" >"${work}/${name}.log" 2>&1
  status=$?
  line="$(grep -m1 -E "${pattern}" "${work}/${name}.log")"
  if [[ ${status} != 0 && -n "${line}" ]]; then
    report "${name}" 1 "reported: ${line:0:160}"
  else
    report "${name}" 0 "exit ${status}, expected report /${pattern}/ not found"
  fi
done

# Invalid memory accesses: NAME PROGRAM MODE STATUS PATTERN...: the exit status
# (139: killed by SIGSEGV; "non-zero": a sanitizer's exit) and each pattern's
# line, in order; "!PATTERN": no such line. One "simt:" line at most.
illegal_address="^simt: kernel WildReadKernel \(launched at .*simt_fault_signal\.cu:[0-9]+\) \
block \([01],0,0\) thread 37: invalid memory access at 0x40 \(SIGSEGV\), as a GPU's \
illegal address \(PE_SIMT_SEED=[0-9]+\)$"
signal_case() {
  local name="$1" program="$2" mode="$3" expected="$4"
  shift 4
  # The group's redirection keeps bash's "Segmentation fault" notice out.
  { (ulimit -c 0 && exec "${program}" "${mode}") >"${work}/${name}.log" 2>&1; } 2>/dev/null
  local status=$? at=0 pattern found
  if [[ "${expected}" == non-zero && ${status} == 0 ]] ||
    [[ "${expected}" != non-zero && ${status} != "${expected}" ]]; then
    report "${name}" 0 "exit ${status}, expected ${expected}: $(head -c 300 "${work}/${name}.log")"
    return
  fi
  for pattern in "$@"; do
    if [[ "${pattern}" == '!'* ]]; then
      found="$(grep -m1 -E "${pattern#!}" "${work}/${name}.log")"
      [[ -z "${found}" ]] && continue
      report "${name}" 0 "unexpected line: ${found:0:160}"
      return
    fi
    found="$(tail -n +$((at + 1)) "${work}/${name}.log" | grep -n -m1 -E "${pattern}")"
    if [[ -z "${found}" ]]; then
      report "${name}" 0 "exit ${status}, expected /${pattern}/ (in order) not found"
      return
    fi
    at=$((at + ${found%%:*}))
  done
  if [[ $(grep -c '^simt:' "${work}/${name}.log") -gt 1 ]]; then
    report "${name}" 0 "more than one simt: line"
    return
  fi
  report "${name}" 1 "exit ${status}: $(grep -m1 '^simt:' "${work}/${name}.log" | head -c 160)"
}
signal_case wild_read_in_lane "${work}/simt_fault_signal" lane 139 "${illegal_address}"
signal_case wild_read_chained "${work}/simt_fault_signal" chained 139 "${illegal_address}" \
  '^previous handler: signal 11 at 0x40$'
signal_case wild_read_on_host "${work}/simt_fault_signal" host 139 '!simt:'
if [[ -n "${signal_sanitized_build}" ]]; then
  signal_case wild_read_sanitized "${work}/simt_fault_signal_sanitized" lane non-zero \
    'AddressSanitizer: SEGV on unknown address 0x0+40' \
    '^simt: sanitizer report in kernel WildReadKernel .* thread \(37,0,0\)'
fi

if speed="$("${work}/simt_speed" 2>&1)"; then
  report speed 1 "$(echo "${speed}" | tr '\n' ';')"
else
  report speed 0 "${speed}"
fi
echo "simt selftest: ${passed} passed, ${failed} failed ($((SECONDS - start)) s)"
[[ ${failed} == 0 ]]
