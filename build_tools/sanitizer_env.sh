# The sanitizer settings every sanitized build and run here shares
# (build_tools/sanitize.sh, build_tools/simt_gpu_check.sh): source it.
#
#   PE_SANITIZE_FLAGS   compile and link flags: ASan + UBSan, every report fatal
#   pe_sanitized_python_env LOG_DIR
#                       sets the array PE_SANITIZED_RUN_ENV: the `env` settings
#                       that run the (uninstrumented) Python interpreter with the
#                       sanitizer runtimes preloaded; reports go to LOG_DIR/asan.*
#                       and LOG_DIR/ubsan.* when LOG_DIR is given, else to stderr
PE_SANITIZE_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"

pe_sanitized_python_env() {
  local log_dir="${1:-}" compiler="${CXX:-g++}" asan_log="" ubsan_log=""
  if [[ -n "${log_dir}" ]]; then
    asan_log=":log_path=${log_dir}/asan"
    ubsan_log=":log_path=${log_dir}/ubsan"
  fi
  # The interpreter is not instrumented: the runtimes come first, and Python's
  # own allocator steps aside so that ASan sees every block.
  PE_SANITIZED_RUN_ENV=(
    LD_PRELOAD="$("${compiler}" -print-file-name=libasan.so):$("${compiler}" -print-file-name=libubsan.so)"
    PYTHONMALLOC=malloc
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1${asan_log}"
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${ubsan_log}"
  )
}
