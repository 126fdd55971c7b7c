# Old glibc and libstdc++ symbol versions for the shared libraries, so that a
# wheel built here installs wherever TensorFlow 2.21's manylinux_2_27 wheels
# do (see cc/compat/old_symbol_versions.cc and docs/wheels.md).
#
# pe_keep_old_symbol_versions(target) links cc/compat/old_symbol_versions.cc
# into `target` and passes the linker one --wrap=NAME for each __wrap_NAME that
# file defines: the file is the one list of the symbols redirected.
# PE_OLD_SYMBOL_VERSIONS (default ON on x86_64 Linux) turns it off.

if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
  set(_pe_old_symbols_default ON)
else()
  set(_pe_old_symbols_default OFF)
endif()
option(PE_OLD_SYMBOL_VERSIONS
  "Bind glibc/libstdc++ symbols to the versions manylinux_2_27 allows (x86_64 Linux)"
  ${_pe_old_symbols_default})

set(_pe_old_symbols_source "${CMAKE_CURRENT_LIST_DIR}/../../cc/compat/old_symbol_versions.cc")
get_filename_component(_pe_old_symbols_source "${_pe_old_symbols_source}" ABSOLUTE)

function(pe_keep_old_symbol_versions target)
  if(NOT PE_OLD_SYMBOL_VERSIONS)
    return()
  endif()
  file(STRINGS "${_pe_old_symbols_source}" _lines REGEX "PE_HIDDEN.*__wrap_[A-Za-z0-9_]+")
  set(_names "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "__wrap_([A-Za-z0-9_]+)" _ "${_line}")
    list(APPEND _names "${CMAKE_MATCH_1}")
  endforeach()
  list(REMOVE_DUPLICATES _names)
  if(NOT _names)
    message(FATAL_ERROR "${_pe_old_symbols_source} defines no __wrap_ symbol")
  endif()
  target_sources(${target} PRIVATE "${_pe_old_symbols_source}")
  # The .symver bindings live in top-level asm, which link-time optimization
  # (pybind11 turns it on for the kernel module) would leave unapplied.
  set_source_files_properties("${_pe_old_symbols_source}" PROPERTIES COMPILE_OPTIONS "-fno-lto")
  foreach(_name IN LISTS _names)
    target_link_options(${target} PRIVATE "LINKER:--wrap=${_name}")
  endforeach()
endfunction()
