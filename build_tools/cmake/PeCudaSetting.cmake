# Resolves PE_ENABLE_CUDA (AUTO, ON or OFF) into PE_CUDA_ENABLED for this
# configure, looking for the toolchain of PE_CUDA_TOOLCHAIN each time.
#
# Sets, in the caller's scope (plain variables, never cached, so nothing that
# was found or missing sticks to the build folder):
#   PE_CUDA_ENABLED   ON or OFF: whether the CUDA kernels are built
#   PE_CUDA_SETTING   AUTO, ON or OFF: PE_ENABLE_CUDA, normalized
#   PE_CUDA_REASON    one line: why CUDA is on or off
#   PE_CUDA_FALLBACK  where AUTO fell back to the CPU kernels, what was
#                     missing; empty otherwise
# With AUTO, a fallback is a CMake WARNING (the CPU-only build is never
# silent); build_info() in Python reports it too.
#
# A build folder configured before PE_ENABLE_CUDA became AUTO holds a BOOL
# entry that option() wrote with the detection result of that day; it is
# taken as AUTO (the entry cannot tell a detected OFF from a requested one,
# and re-detecting is what the default asks for): pass -DPE_ENABLE_CUDA=OFF
# again to keep such a folder CPU-only.

macro(pe_resolve_cuda_setting)
  get_property(_pe_cuda_entry_type CACHE PE_ENABLE_CUDA PROPERTY TYPE)
  if(_pe_configured_before AND _pe_cuda_entry_type STREQUAL "BOOL")
    message(STATUS "partial_embedding: PE_ENABLE_CUDA=${PE_ENABLE_CUDA} in the cache "
      "comes from an older configure of this folder: re-detecting (AUTO)")
    set(PE_ENABLE_CUDA "AUTO" CACHE STRING
      "Build the CUDA kernels: AUTO (where the toolchain is found, re-detected at every configure), ON or OFF"
      FORCE)
  endif()
  string(TOUPPER "${PE_ENABLE_CUDA}" PE_CUDA_SETTING)
  if(NOT PE_CUDA_SETTING STREQUAL "AUTO")
    if(PE_CUDA_SETTING MATCHES "^(ON|1|TRUE|YES|Y)$")
      set(PE_CUDA_SETTING ON)
    elseif(PE_CUDA_SETTING MATCHES "^(OFF|0|FALSE|NO|N|)$")
      set(PE_CUDA_SETTING OFF)
    else()
      message(FATAL_ERROR "PE_ENABLE_CUDA must be AUTO, ON or OFF, not '${PE_ENABLE_CUDA}'")
    endif()
  endif()

  set(PE_CUDA_FALLBACK "")
  set(_pe_cuda_found OFF)
  set(_pe_cuda_missing "")
  if(PE_CUDA_SETTING STREQUAL "OFF")
    # Explicitly off: nothing is looked for.
  elseif(PE_CUDA_TOOLCHAIN STREQUAL "clang12")
    include(Cuda12Clang)
    pe_find_cuda12_clang()
    set(_pe_cuda_found ${PE_CUDA12_FOUND})
    string(REPLACE ";" "; " _pe_cuda_missing "${PE_CUDA12_MISSING}")
  elseif(PE_CUDA_TOOLCHAIN STREQUAL "nvcc")
    include(CheckLanguage)
    # check_language() caches a compiler it did not find as NOTFOUND and then
    # never looks again: forget that, so a toolkit installed since is found.
    if(DEFINED CACHE{CMAKE_CUDA_COMPILER} AND NOT CMAKE_CUDA_COMPILER)
      unset(CMAKE_CUDA_COMPILER CACHE)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(_pe_cuda_found ON)
    else()
      set(_pe_cuda_missing "nvcc (a CUDA toolkit on PATH or CUDACXX)")
    endif()
  else()
    message(FATAL_ERROR "PE_CUDA_TOOLCHAIN must be clang12 or nvcc, not '${PE_CUDA_TOOLCHAIN}'")
  endif()

  if(PE_CUDA_SETTING STREQUAL "OFF")
    set(PE_CUDA_ENABLED OFF)
    set(PE_CUDA_REASON "PE_ENABLE_CUDA=OFF was given")
  elseif(PE_CUDA_SETTING STREQUAL "ON")
    # A missing piece is a FATAL_ERROR where the toolchain is set up.
    set(PE_CUDA_ENABLED ON)
    set(PE_CUDA_REASON "PE_ENABLE_CUDA=ON was given")
  elseif(_pe_cuda_found)
    set(PE_CUDA_ENABLED ON)
    set(PE_CUDA_REASON "PE_ENABLE_CUDA=AUTO found the ${PE_CUDA_TOOLCHAIN} toolchain")
  else()
    set(PE_CUDA_ENABLED OFF)
    set(PE_CUDA_FALLBACK "the ${PE_CUDA_TOOLCHAIN} CUDA toolchain lacks: ${_pe_cuda_missing}")
    set(PE_CUDA_REASON "PE_ENABLE_CUDA=AUTO fell back to CPU-only: ${PE_CUDA_FALLBACK}")
    message(WARNING "partial_embedding: CPU-ONLY BUILD, no CUDA kernels: ${PE_CUDA_FALLBACK}. "
      "For the GPU build: apt-get install clang-19; pip install -r "
      "build_tools/requirements-cuda12.txt; then pip install --no-build-isolation . "
      "(re-detected at every configure; -DPE_ENABLE_CUDA=ON makes a missing piece an "
      "error, -DPE_ENABLE_CUDA=OFF silences this).")
  endif()
  message(STATUS "partial_embedding: PE_CUDA_ENABLED=${PE_CUDA_ENABLED} (${PE_CUDA_REASON})")
endmacro()
