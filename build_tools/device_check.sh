#!/usr/bin/env bash
# The one call to make on a lent GPU machine: every GPU check of this project, in order, each within a
# time budget of its own, the findings in one JSON file. It runs ON the GPU machine (CUDA 13, nvcc,
# CuPy, PyTorch, CMake, pybind11, CPython 3.12, no network; TensorFlow only from the parts that
# ../shared/gpu/pack.sh makes, see ../shared/gpu/README.md).
#
# First, here (no GPU, no TensorFlow needed; about a second):
#
#   build_tools/device_check.sh --dry-run [--steps 1,3]
#
# prints every step with its command and budget, which .gpu_tf/ files exist to carry and which are
# missing, and the device tool's `run` calls to make, in order and back to back: one per TensorFlow
# part but the last, then the last one, which runs this script:
#
#   run  command: "bash build_tools/device_check.sh"   timeout_s: 540
#        carry: [".gpu_tf/partNN" (the last part), ".gpu_tf/parts.txt", ".gpu_tf/on_device.sh"]
#
# Make the parts beforehand with `PYTHON=.venv/bin/python ../shared/gpu/pack.sh` after `pip install .`
# (5-9 min of CPU). Without them steps 2-6 are skipped, each with that reason, and step 1 still runs.
# Then give_back, unless you rerun at once.
#
# The steps (--steps 1,3 or --steps 2-6 picks some; they always run in this order):
#   1 gpu_check    build_tools/gpu_check.sh --seed random: builds the kernel module (the CUDA 12 line
#                  where its pieces exist, and then the machine's nvcc too; else nvcc alone), checks and
#                  times every kernel without TensorFlow ($OUT/gpu_check.json); its adam_timing holds
#                  issue #45's fused masked Adam at k = 524,288 unique rows against the memory floor.
#   2 gpu_step     the smoke check through TensorFlow, gpu_check.sh --tensorflow --no-timing
#                  (python -m partial_embedding.bench --gpu-step), by default and with the opt-in
#                  PARTIAL_EMBEDDING_GPU_FUSED=1 ($OUT/gpu_step.json, $OUT/gpu_step_fused.json).
#   3 fused_tests  PARTIAL_EMBEDDING_GPU_FUSED=1 python3 -m pytest tests/ops/test_fused_gpu.py
#                  tests/ops/test_xla_custom_call_gpu.py (the fused kernels; the XLA custom calls' CUDA
#                  handlers, which skip without the opt-in).
#   4 tests        python3 -m pytest tests (io, package and tools included; not slow), the GPU visible.
#   5 step_time    our training step against stock Keras at V = 1M and 8M, and the embedding's cost
#                  (the step minus the head alone), issue #45 (bench --gpu-step --timing-only,
#                  3 interleaved rounds of 10 steps), by default and with the opt-in.
#   6 host_table   a table twice the GPU memory TensorFlow may use (512 MiB, set in a fresh process)
#                  with frozen_rows_on="host", against a table that fits and keras.layers.Embedding +
#                  Adam on /CPU:0, issue #45 (bench --gpu-host-table); the frozen rows bit for bit.
# Steps 2-6 run in the environment that .gpu_tf/on_device.sh sets up (TensorFlow unpacked from the
# parts; the machine's CUDA 13 libraries under the CUDA 12 names TensorFlow opens), which this script
# asks of on_device.sh once, before step 2. Step 1 runs without it. Steps 3 and 4 run without OUT, so
# that nothing a test or benchmark writes lands among the files that come back. Steps 5 and 6 print
# their findings as JSON lines (step 5 one after each V), whose last the report copies into
# device_check.json.
#
# Budgets in seconds, from the environment: DEVICE_CHECK_TOTAL_S (470: the whole run, TensorFlow's
# set-up included; keep it under 8 min), DEVICE_CHECK_BUDGET_TF (60: unpacking and importing
# TensorFlow), DEVICE_CHECK_BUDGET_1 .. _6 (130, 55, 50, 70, 60, 45). A run that overruns is killed with
# its process group and recorded as timed out; later steps run while time is left. The runs of one
# step share its budget (the first of two gets half, the second what is left). Also:
# PYTHON (python3), DEVICE_CHECK_SEED (step 2's seed; drawn at random and recorded),
# DEVICE_CHECK_WORKERS (14: step 4's pytest workers), OUT (where the files go; else build/device_check/).
#
# Files (at most 7, as the device tool brings back 8 from $OUT): device_check.json (per step its
# commands, and per run the exit code, seconds, timed_out or why it was skipped; parsed figures:
# gpu_check's summary line, status, checks and failures; the smoke check's results and which fused
# ops each fit traced; pytest's passed/failed/skipped counts, per test file, and failed tests; the
# step-time lines and findings; the host-table findings; and "issue_45": every figure issue #45
# asks for with its target, its value and whether it was met, or why it is missing),
# device_check_summary.txt (also printed at the end), device_check.log (every run's output, in
# order), gpu_check.json, gpu_check_nvcc.json (only when two builds ran), gpu_step.json and
# gpu_step_fused.json. device_check.json is rewritten after every step, so a call cut short still
# brings back what ran. `--dry-run` writes the same JSON shape, every step "dry_run": true.
#
# Exit status: 0 when every step that ran passed; 1 when a correctness step (1-4, 6) failed or timed out,
# or TensorFlow's set-up failed although its parts were there (skipped steps do not count);
# 2 for a bad argument.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
python="${PYTHON:-python3}"

usage() {
  sed -n '2,/^set -euo pipefail$/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
}
fail_usage() {
  echo "device_check: $1 (see --help)" >&2
  exit 2
}

dry_run=0
steps_arg=1-6
steps_given=0
while (($# > 0)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --steps)
      (($# >= 2)) || fail_usage "--steps needs a value, e.g. --steps 1,3"
      steps_arg="$2" steps_given=1
      shift
      ;;
    --steps=*) steps_arg="${1#--steps=}" steps_given=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) fail_usage "unknown argument '$1'" ;;
  esac
  shift
done

declare -A selected=()
IFS=',' read -r -a step_items <<<"${steps_arg}"
for item in "${step_items[@]}"; do
  if [[ "${item}" =~ ^([1-6])-([1-6])$ ]]; then
    for ((number = BASH_REMATCH[1]; number <= BASH_REMATCH[2]; number++)); do
      selected[${number}]=1
    done
  elif [[ "${item}" =~ ^[1-6]$ ]]; then
    selected[${item}]=1
  else
    fail_usage "--steps takes step numbers 1-6, e.g. 1,3 or 2-6; got '${steps_arg}'"
  fi
done
steps=()
for number in 1 2 3 4 5 6; do
  if [[ -n "${selected[${number}]:-}" ]]; then
    steps+=("${number}")
  fi
done
((${#steps[@]} > 0)) || fail_usage "--steps selects no step"

number_from_env() { # NAME DEFAULT
  local value="${!1:-$2}"
  [[ "${value}" =~ ^[0-9]+$ ]] || fail_usage "$1 must be a number of seconds, got '${value}'"
  echo "${value}"
}
total_budget="$(number_from_env DEVICE_CHECK_TOTAL_S 470)"
tf_budget="$(number_from_env DEVICE_CHECK_BUDGET_TF 60)"
budget=(0
  "$(number_from_env DEVICE_CHECK_BUDGET_1 130)"
  "$(number_from_env DEVICE_CHECK_BUDGET_2 55)"
  "$(number_from_env DEVICE_CHECK_BUDGET_3 50)"
  "$(number_from_env DEVICE_CHECK_BUDGET_4 70)"
  "$(number_from_env DEVICE_CHECK_BUDGET_5 60)"
  "$(number_from_env DEVICE_CHECK_BUDGET_6 45)")
workers="$(number_from_env DEVICE_CHECK_WORKERS 14)"
seed="$(number_from_env DEVICE_CHECK_SEED $(((RANDOM << 15) | RANDOM)))"
min_run_seconds=10 # a run given less than this is skipped as "no time left"

work_dir="${root}/build/device_check"
out_dir="${OUT:-${work_dir}}"
mkdir -p "${work_dir}" "${out_dir}"
out_dir="$(cd "${out_dir}" && pwd)"
log="${out_dir}/device_check.log"
plan="${work_dir}/plan.tsv"
records="${work_dir}/runs.tsv"
tf_env_json="${work_dir}/tensorflow_env.json"
tf_env_file="${work_dir}/tensorflow_env.sh"
base_env_json="${work_dir}/base_env.json"
started="${EPOCHREALTIME:-$(date +%s.%N)}"

shown() { # a path as the commands show it: relative to the project root when inside it
  local path="$1"
  [[ "${path}" == "${root}/"* ]] && path="${path#"${root}/"}"
  printf '%q' "${path}"
}

# --- the plan: step, name, title, needs TensorFlow, correctness, budget, run label, when, command ----
py="$(printf '%q' "${python}")"
step_name=([1]=gpu_check [2]=gpu_step [3]=fused_tests [4]=tests [5]=step_time [6]=host_table)
step_title=(
  [1]="kernel module: build, correctness and timing, no TensorFlow (gpu_check.sh)"
  [2]="smoke check of the first training step through TensorFlow (bench --gpu-step), default and opt-in"
  [3]="the fused ops' GPU kernels and the XLA custom calls' CUDA handlers against the CPU's, opt-in"
  [4]="the whole test suite with the GPU visible"
  [5]="step time and the embedding's cost against stock Keras at V = 1M and 8M, default and opt-in"
  [6]="a table twice the GPU memory TensorFlow may use, frozen rows on the host")
step_tf=([1]=0 [2]=1 [3]=1 [4]=1 [5]=1 [6]=1)
step_correctness=([1]=1 [2]=1 [3]=1 [4]=1 [5]=0 [6]=1)
step_time_command="${py} -m partial_embedding.bench --gpu-step --timing-only"
step_time_command+=" --vocabs 1000000 8000000 --width 64 --batch 256 --ids-per-sample 16 --rounds 3 --steps 10"
host_table_limit_mb=512
pytest_flags="-v -p no:cacheprovider --tb=short -rfE"
: >"${plan}"
add_run() { # step label when command
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "${step_name[$1]}" "${step_title[$1]}" \
    "${step_tf[$1]}" "${step_correctness[$1]}" "${budget[$1]}" "$2" "$3" "$4" >>"${plan}"
}
add_run 1 auto always \
  "PE_GPU_CHECK_JSON=$(shown "${out_dir}/gpu_check.json") bash build_tools/gpu_check.sh --seed random"
add_run 1 nvcc "the first build used the CUDA 12 line (clang12)" \
  "PE_GPU_CHECK_TOOLCHAIN=nvcc PE_GPU_CHECK_BUILD_DIR=build/gpu_check_nvcc PE_GPU_CHECK_JSON=$(shown "${out_dir}/gpu_check_nvcc.json") bash build_tools/gpu_check.sh --seed random"
add_run 2 default always \
  "env -u PARTIAL_EMBEDDING_GPU_FUSED bash build_tools/gpu_check.sh --tensorflow --no-timing --seed ${seed} --json $(shown "${out_dir}/gpu_step.json")"
add_run 2 fused always \
  "PARTIAL_EMBEDDING_GPU_FUSED=1 bash build_tools/gpu_check.sh --tensorflow --no-timing --seed ${seed} --json $(shown "${out_dir}/gpu_step_fused.json")"
add_run 3 fused always \
  "env -u OUT PARTIAL_EMBEDDING_GPU_FUSED=1 ${py} -m pytest tests/ops/test_fused_gpu.py tests/ops/test_xla_custom_call_gpu.py -n 8 ${pytest_flags}"
add_run 4 default always \
  "env -u OUT -u PARTIAL_EMBEDDING_GPU_FUSED ${py} -m pytest tests -n ${workers} --dist worksteal -m 'not slow' ${pytest_flags}"
add_run 5 default always "env -u PARTIAL_EMBEDDING_GPU_FUSED ${step_time_command}"
add_run 5 fused always "PARTIAL_EMBEDDING_GPU_FUSED=1 ${step_time_command}"
add_run 6 default always \
  "env -u PARTIAL_EMBEDDING_GPU_FUSED ${py} -m partial_embedding.bench --gpu-host-table --memory-limit-mb ${host_table_limit_mb} --timeout $((budget[6] > 15 ? budget[6] - 5 : 10))"
tf_setup_command="bash .gpu_tf/on_device.sh ${py} -c 'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], \"w\"))' $(shown "${tf_env_json}")"

# --- the JSON, the summary and the dry run's listing: Python (python3 is on the GPU machine) --------
helper() {
  DC_ROOT="${root}" DC_OUT="${out_dir}" DC_WORK="${work_dir}" DC_LOG="${log}" DC_PLAN="${plan}" \
    DC_RECORDS="${records}" DC_DRY_RUN="${dry_run}" DC_STARTED="${started}" DC_TOTAL="${total_budget}" \
    DC_TF_BUDGET="${tf_budget}" DC_TF_COMMAND="${tf_setup_command}" DC_TF_ENV_JSON="${tf_env_json}" \
    DC_TF_ENV_FILE="${tf_env_file}" DC_BASE_ENV_JSON="${base_env_json}" DC_SEED="${seed}" DC_PYTHON="${python}" DC_STEPS="${steps[*]}" \
    DC_STEPS_ARG="${steps_arg}" DC_STEPS_GIVEN="${steps_given}" DC_GPU="${gpu:-}" DC_OUT_SET="${OUT:+1}" \
    python3 "${root}/build_tools/device_check_report.py" "$@"
}

budget_sum=0
for number in "${steps[@]}"; do
  budget_sum=$((budget_sum + budget[number]))
done
needs_tf=0
for number in "${steps[@]}"; do
  if ((step_tf[number])); then needs_tf=1; fi
done
((needs_tf)) && budget_sum=$((budget_sum + tf_budget))
budget_line="device_check: budgets (s): total ${total_budget} (DEVICE_CHECK_TOTAL_S)"
((needs_tf)) && budget_line+=", TensorFlow set-up ${tf_budget} (DEVICE_CHECK_BUDGET_TF)"
for number in "${steps[@]}"; do
  budget_line+=", step ${number} ${budget[number]} (DEVICE_CHECK_BUDGET_${number})"
done
echo "${budget_line}; steps ${steps[*]}; seed ${seed}; out ${out_dir}"
if ((budget_sum > total_budget)); then
  echo "device_check: NOTE: the budgets add up to ${budget_sum} s, over the total: the last steps get what is left"
fi

: >"${records}"
if ((dry_run)); then
  helper dry-run
  exit 0
fi

# --- the real run --------------------------------------------------------------------------------
gpu="$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
  head -n 1 || true)"
: >"${log}"
deadline=$((SECONDS + total_budget))
now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
log_size() { stat -c %s "${log}"; }
record() { # kind step label rc start end budget log_start log_end reason command
  local IFS=$'\t'
  printf '%s\n' "$*" | tr -d '\r' >>"${records}"
}
progress() { printf '[%4d s] %s\n' "$((SECONDS))" "$*"; }

# Runs one command under `timeout` (which kills the command's whole process group), its output
# appended to the log; TensorFlow's environment first where the step needs it.
run_one() { # step label needs_tf budget command
  local step="$1" label="$2" with_tf="$3" run_budget="$4" command="$5" rc start end log_start log_end elapsed
  printf '\n===== step %s %s [%s], budget %s s\n$ %s\n' "${step}" "${step_name[step]}" "${label}" \
    "${run_budget}" "${command}" >>"${log}"
  progress "step ${step} ${step_name[step]} [${label}], budget ${run_budget} s: ${command}"
  log_start="$(log_size)"
  start="$(now)"
  elapsed=${SECONDS}
  set +e
  if ((with_tf)); then
    # shellcheck disable=SC1090
    (. "${tf_env_file}" && exec timeout -k 10 "${run_budget}" bash -c "${command}") >>"${log}" 2>&1 </dev/null
  else
    timeout -k 10 "${run_budget}" bash -c "${command}" >>"${log}" 2>&1 </dev/null
  fi
  rc=$?
  set -e
  end="$(now)"
  log_end="$(log_size)"
  elapsed=$((SECONDS - elapsed))
  printf '===== exit %s after %s s\n' "${rc}" "${elapsed}" >>"${log}"
  record run "${step}" "${label}" "${rc}" "${start}" "${end}" "${run_budget}" "${log_start}" \
    "${log_end}" "" "${command}"
  if ((rc == 124 || rc == 137)) && ((elapsed + 1 >= run_budget)); then
    progress "step ${step} [${label}]: TIMED OUT after ${elapsed} s"
  else
    progress "step ${step} [${label}]: exit ${rc} after ${elapsed} s"
  fi
}

tf_state=""
tf_reason=""
setup_tensorflow() {
  local rc start end log_start log_end setup_budget result
  if [[ ! -f .gpu_tf/on_device.sh ]]; then
    result="$(helper tensorflow absent 0 0 "${tf_budget}" 0 0 "${tf_setup_command}")" ||
      result=$'failed\tthe helper that reads the set-up failed'
  else
    setup_budget=$((deadline - SECONDS < tf_budget ? deadline - SECONDS : tf_budget))
    ((setup_budget > 0)) || setup_budget=1
    printf '\n===== TensorFlow set-up, budget %s s\n$ %s\n' "${setup_budget}" "${tf_setup_command}" >>"${log}"
    progress "TensorFlow set-up, budget ${setup_budget} s: ${tf_setup_command}"
    rm -f "${tf_env_json}" "${tf_env_file}" "${base_env_json}"
    "${python}" -c 'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], "w"))' \
      "${base_env_json}" </dev/null || true
    log_start="$(log_size)"
    start="$(now)"
    set +e
    timeout -k 10 "${setup_budget}" bash -c "${tf_setup_command}" >>"${log}" 2>&1 </dev/null
    rc=$?
    set -e
    end="$(now)"
    log_end="$(log_size)"
    printf '===== exit %s\n' "${rc}" >>"${log}"
    result="$(helper tensorflow "${rc}" "${start}" "${end}" "${setup_budget}" "${log_start}" "${log_end}" \
      "${tf_setup_command}")" || result=$'failed\tthe helper that reads the set-up failed'
  fi
  tf_state="${result%%$'\t'*}"
  tf_reason="${result#*$'\t'}"
  progress "TensorFlow set-up: ${tf_state}: ${tf_reason}"
}

helper assemble || echo "device_check: could not write device_check.json" >&2
for step in "${steps[@]}"; do
  if ((step_tf[step])) && [[ -z "${tf_state}" ]]; then
    setup_tensorflow
  fi
  step_deadline=$((SECONDS + budget[step]))
  if ((step_deadline > deadline)); then step_deadline=${deadline}; fi
  mapfile -t labels < <(awk -F'\t' -v s="${step}" '$1 == s {print $7}' "${plan}")
  mapfile -t whens < <(awk -F'\t' -v s="${step}" '$1 == s {print $8}' "${plan}")
  mapfile -t commands < <(awk -F'\t' -v s="${step}" '$1 == s {print $9}' "${plan}")
  for index in "${!labels[@]}"; do
    label="${labels[index]}" when="${whens[index]}" command="${commands[index]}"
    if ((step_tf[step])) && [[ "${tf_state}" != ready ]]; then
      record skip "${step}" "${label}" "" "" "" "" "" "" "TensorFlow is not set up: ${tf_reason}" "${command}"
      continue
    fi
    if [[ "${when}" != always ]]; then
      toolchain="$(helper toolchain gpu_check.json)" || toolchain=""
      if [[ "${toolchain}" != clang12 ]]; then
        record unneeded "${step}" "${label}" "" "" "" "" "" "" \
          "$([[ -n "${toolchain}" ]] && echo "the first build used ${toolchain}: one build only" || echo "the first build did not finish: no second build")" "${command}"
        continue
      fi
    fi
    runs_left=0 # this run and the later unconditional ones of the step share what is left
    for later in "${!labels[@]}"; do
      if ((later == index)) || { ((later > index)) && [[ "${whens[later]}" == always ]]; }; then
        runs_left=$((runs_left + 1))
      fi
    done
    run_budget=$(((step_deadline - SECONDS) / runs_left))
    if ((run_budget < min_run_seconds)); then
      record skip "${step}" "${label}" "" "" "" "" "" "" "no time left: $((step_deadline - SECONDS)) s of the step's budget, $((deadline - SECONDS)) s of the total" "${command}"
      progress "step ${step} [${label}]: skipped, no time left"
      continue
    fi
    run_one "${step}" "${label}" "${step_tf[step]}" "${run_budget}" "${command}"
  done
  helper assemble || echo "device_check: could not write device_check.json" >&2
done

set +e
helper final
status=$?
set -e
exit "${status}"
