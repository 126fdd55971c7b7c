# Writes _build_info.json: what partial_embedding.build_info() reports about
# this build (see python/partial_embedding/_build_info.py for the keys). It is
# written into the build folder at configure time and copied next to the op
# library at every build, once the library is linked, so the file in the package always describes the
# library beside it (and travels into the wheel with it).

# "value" as a JSON string.
function(_pe_json_string out value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  string(REPLACE "\n" " " value "${value}")
  set(${out} "\"${value}\"" PARENT_SCOPE)
endfunction()

# A CMake list as a JSON array of strings.
function(_pe_json_array out)
  set(items "")
  foreach(item IN LISTS ARGN)
    _pe_json_string(quoted "${item}")
    list(APPEND items "${quoted}")
  endforeach()
  string(REPLACE ";" ", " items "${items}")
  set(${out} "[${items}]" PARENT_SCOPE)
endfunction()

# CMake architectures ("75-real", "90", "90-virtual") as SASS and PTX targets.
function(_pe_sass_and_ptx architectures sass_out ptx_out)
  set(sass "")
  set(ptx "")
  foreach(arch IN LISTS architectures)
    if(arch MATCHES "^([0-9]+[a-z]?)-real$")
      list(APPEND sass "sm_${CMAKE_MATCH_1}")
    elseif(arch MATCHES "^([0-9]+[a-z]?)-virtual$")
      list(APPEND ptx "compute_${CMAKE_MATCH_1}")
    elseif(arch MATCHES "^([0-9]+[a-z]?)$")
      list(APPEND sass "sm_${CMAKE_MATCH_1}")
      list(APPEND ptx "compute_${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${sass_out} "${sass}" PARENT_SCOPE)
  set(${ptx_out} "${ptx}" PARENT_SCOPE)
endfunction()

# The first line `tool --version` prints.
function(_pe_tool_version out tool)
  execute_process(COMMAND "${tool}" --version OUTPUT_VARIABLE text ERROR_QUIET)
  string(REGEX MATCH "[^\n]+" first "${text}")
  set(${out} "${first}" PARENT_SCOPE)
endfunction()

# Fills PE_BI_* for the template from what this configure decided.
function(_pe_build_info_values)
  set(cuda_compiler "")
  set(cuda_line "")
  set(architectures "")
  if(PE_CUDA_ENABLED AND PE_CUDA_TOOLCHAIN STREQUAL "clang12")
    _pe_tool_version(clang_version "${PE_CLANG_CUDA_COMPILER}")
    set(cuda_compiler "${PE_CLANG_CUDA_COMPILER}: ${clang_version}")
    set(cuda_line "clang CUDA 12 line: CUDA headers ${PE_CUDA12_INCLUDE_DIR}, ptxas ${PE_CUDA12_PTXAS_VERSION}, runtime of TensorFlow")
    set(architectures "${PE_CUDA12_ARCHITECTURES}")
  elseif(PE_CUDA_ENABLED)
    set(cuda_compiler "${CMAKE_CUDA_COMPILER}: ${CMAKE_CUDA_COMPILER_ID} ${CMAKE_CUDA_COMPILER_VERSION}")
    set(cuda_line "nvcc CUDA ${CMAKE_CUDA_COMPILER_VERSION}, static private runtime")
    set(architectures "${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  _pe_sass_and_ptx("${architectures}" sass ptx)
  set(abi "")
  foreach(definition IN LISTS TensorFlow_DEFINITIONS)
    if(definition MATCHES "^_GLIBCXX_USE_CXX11_ABI=(.*)$")
      set(abi "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(PE_CUDA_ENABLED)
    set(PE_BI_CUDA true PARENT_SCOPE)
  else()
    set(PE_BI_CUDA false PARENT_SCOPE)
  endif()
  if(PE_CUDA_ENABLED AND PE_KERNEL_MODULE_CUDA AND PE_BUILD_KERNEL_MODULE)
    set(PE_BI_MODULE_CUDA true PARENT_SCOPE)
  else()
    set(PE_BI_MODULE_CUDA false PARENT_SCOPE)
  endif()
  foreach(pair
      "SETTING;${PE_CUDA_SETTING}" "REASON;${PE_CUDA_REASON}" "FALLBACK;${PE_CUDA_FALLBACK}"
      "TOOLCHAIN;${PE_CUDA_TOOLCHAIN}" "CUDA_COMPILER;${cuda_compiler}"
      "CUDA_LINE;${cuda_line}"
      "CXX;${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER})"
      "TF_VERSION;${TensorFlow_VERSION}" "ABI;${abi}" "BUILD_TYPE;${CMAKE_BUILD_TYPE}"
      "CMAKE_VERSION;${CMAKE_VERSION}")
    list(GET pair 0 key)
    list(LENGTH pair length)
    set(value "")
    if(length GREATER 1)
      list(SUBLIST pair 1 -1 value)
      list(JOIN value ";" value)
    endif()
    _pe_json_string(quoted "${value}")
    set(PE_BI_${key} "${quoted}" PARENT_SCOPE)
  endforeach()
  _pe_json_array(json "${architectures}")
  set(PE_BI_ARCHITECTURES "${json}" PARENT_SCOPE)
  _pe_json_array(json ${sass})
  set(PE_BI_SASS "${json}" PARENT_SCOPE)
  _pe_json_array(json ${ptx})
  set(PE_BI_PTX "${json}" PARENT_SCOPE)
  _pe_json_array(json ${TensorFlow_DEFINITIONS})
  set(PE_BI_TF_DEFINITIONS "${json}" PARENT_SCOPE)
endfunction()

# Writes the file into the build folder and, when `target` is given, copies
# it into PE_OUTPUT_DIR after `target` links.
function(pe_write_build_info target)
  _pe_build_info_values()
  set(file "${CMAKE_CURRENT_BINARY_DIR}/_build_info.json")
  configure_file("${PROJECT_SOURCE_DIR}/build_tools/build_info.json.in" "${file}" @ONLY)
  if(target)
    # At every build, after the library links: the copy in the package always
    # describes the library beside it, even when only the configure changed.
    add_custom_target(pe_build_info ALL
      COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${file}" "${PE_OUTPUT_DIR}/_build_info.json"
      COMMENT "partial_embedding: _build_info.json next to the op library"
      VERBATIM)
    add_dependencies(pe_build_info ${target})
  endif()
endfunction()
