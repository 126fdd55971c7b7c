# The CUDA 12 line with clang as the CUDA compiler: device code that needs no
# newer NVIDIA driver than TensorFlow 2.21's own GPU build (CUDA 12.5, drivers
# >= 525 through CUDA 12's minor-version compatibility).
#
# Pieces, each found in the active Python environment unless given:
#   PE_CLANG_CUDA_COMPILER  clang++ (Debian's clang-19 by default)
#   PE_CUDA12_INCLUDE_DIR   CUDA 12.5 headers: the copy in the TensorFlow wheel
#                           (tensorflow/include/third_party/gpus/cuda/include)
#   PE_CUDA12_CCCL_DIR      CUB of the 12.x line (nvidia-cuda-cccl-cu12)
#   PE_CUDA12_NVCC_DIR      ptxas and libdevice (nvidia-cuda-nvcc-cu12, <= 12.5)
#   PE_REAL_FATBINARY       NVIDIA's fatbinary, which only packs the images
#                           (any toolkit's: the stand-in in build_tools/cuda12
#                           speaks its newer options and writes uncompressed
#                           images)
#   PE_CUDA12_RUNTIME_DIR   libcudart.so.12 (nvidia-cuda-runtime-cu12), only
#                           for a kernel module with CUDA
# A piece given as a cache entry is checked to be there; one found in the
# environment is not cached, so every configure looks again (a piece
# installed since is found, one removed since is reported).
# They are put together as one CUDA root in the build directory, which clang
# is given as --cuda-path. pe_find_cuda12_clang() sets PE_CUDA12_FOUND (and
# PE_CUDA12_MISSING, what was not found); pe_add_cuda12_clang_library() compiles
# .cu sources into a static library of host objects with embedded fat binaries.
# Their CUDA runtime calls stay undefined: the library linking them chooses the
# runtime (TensorFlow's, or libcudart.so.12).

set(PE_CLANG_CUDA_COMPILER "" CACHE FILEPATH "clang++ used as the CUDA compiler (CUDA 12 line)")
set(PE_CUDA12_INCLUDE_DIR "" CACHE PATH "CUDA 12.x headers (default: TensorFlow's copy)")
set(PE_CUDA12_CCCL_DIR "" CACHE PATH "CCCL 12.x headers (default: nvidia-cuda-cccl-cu12)")
set(PE_CUDA12_NVCC_DIR "" CACHE PATH "ptxas and libdevice (default: nvidia-cuda-nvcc-cu12)")
set(PE_REAL_FATBINARY "" CACHE FILEPATH "NVIDIA fatbinary (any CUDA toolkit)")
set(PE_CUDA12_RUNTIME_DIR "" CACHE PATH "directory of libcudart.so.12 (nvidia-cuda-runtime-cu12)")
set(PE_CUDA12_MAX_VERSION "12.5" CACHE STRING "newest CUDA release whose ptxas may be used")

# Where a package of the Python environment lives, without importing it.
function(_pe_python_package_dir package out)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
      "import importlib.util as u, sys; s = u.find_spec(sys.argv[1]); print(list(s.submodule_search_locations)[0] if s else '')"
      "${package}"
    OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(${out} "${_dir}" PARENT_SCOPE)
endfunction()

# A program found before is looked for again when it has gone since.
function(_pe_find_tool out)
  if(${out} AND NOT EXISTS "${${out}}")
    unset(${out} CACHE)
  endif()
  find_program(${out} ${ARGN})
endfunction()

# Sets `var` in the caller's scope to the directory `given` (a cache entry the
# user set) or, when empty, to `detected`, if `dir/marker` exists; else adds
# `what` to the caller's `missing`. What was detected is never cached: the next
# configure looks again.
macro(_pe_cuda12_piece var detected marker what)
  if(${var})
    set(_pe_piece_dir "${${var}}")
    set(_pe_piece_what "${what} (${var}=${${var}} has no ${marker})")
  else()
    set(_pe_piece_dir "${detected}")
    set(_pe_piece_what "${what}")
  endif()
  if(_pe_piece_dir AND EXISTS "${_pe_piece_dir}/${marker}")
    set(${var} "${_pe_piece_dir}")
    set(${var} "${_pe_piece_dir}" PARENT_SCOPE)
  else()
    list(APPEND missing "${_pe_piece_what}")
  endif()
endmacro()

function(pe_find_cuda12_clang)
  set(missing "")
  if(PE_CLANG_CUDA_COMPILER)
    if(NOT EXISTS "${PE_CLANG_CUDA_COMPILER}")
      list(APPEND missing "clang++ (PE_CLANG_CUDA_COMPILER=${PE_CLANG_CUDA_COMPILER} does not exist)")
    endif()
  else()
    _pe_find_tool(_pe_clang NAMES clang++-19 clang++-20 clang++-18 clang++)
    if(_pe_clang)
      set(PE_CLANG_CUDA_COMPILER "${_pe_clang}" PARENT_SCOPE)
    else()
      list(APPEND missing "clang++ (apt-get install clang-19)")
    endif()
  endif()
  _pe_python_package_dir(tensorflow _tf_dir)
  if(_tf_dir)
    set(_tf_dir "${_tf_dir}/include/third_party/gpus/cuda/include")
  endif()
  _pe_cuda12_piece(PE_CUDA12_INCLUDE_DIR "${_tf_dir}" "cuda.h"
    "CUDA 12 headers (the TensorFlow wheel's copy)")
  _pe_python_package_dir(nvidia.cuda_cccl _cccl_dir)
  if(_cccl_dir)
    set(_cccl_dir "${_cccl_dir}/include")
  endif()
  _pe_cuda12_piece(PE_CUDA12_CCCL_DIR "${_cccl_dir}" "cub/cub.cuh"
    "CUB (pip install nvidia-cuda-cccl-cu12==12.5.*)")
  _pe_python_package_dir(nvidia.cuda_nvcc _nvcc_dir)
  _pe_cuda12_piece(PE_CUDA12_NVCC_DIR "${_nvcc_dir}" "bin/ptxas"
    "ptxas and libdevice (pip install nvidia-cuda-nvcc-cu12==12.5.*)")
  if(PE_REAL_FATBINARY)
    if(NOT EXISTS "${PE_REAL_FATBINARY}")
      list(APPEND missing "fatbinary (PE_REAL_FATBINARY=${PE_REAL_FATBINARY} does not exist)")
    endif()
  else()
    _pe_find_tool(_pe_fatbinary NAMES fatbinary
      HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
    if(_pe_fatbinary)
      set(PE_REAL_FATBINARY "${_pe_fatbinary}" PARENT_SCOPE)
    else()
      list(APPEND missing "fatbinary (any CUDA toolkit)")
    endif()
  endif()
  if(PE_CUDA12_NVCC_DIR AND EXISTS "${PE_CUDA12_NVCC_DIR}/bin/ptxas")
    # The wheel's ptxas may have lost its execute bit.
    file(CHMOD "${PE_CUDA12_NVCC_DIR}/bin/ptxas" FILE_PERMISSIONS
      OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
    execute_process(COMMAND "${PE_CUDA12_NVCC_DIR}/bin/ptxas" --version
      OUTPUT_VARIABLE _ptxas_version ERROR_QUIET)
    string(REGEX MATCH "release ([0-9]+\\.[0-9]+)" _ "${_ptxas_version}")
    set(PE_CUDA12_PTXAS_VERSION "${CMAKE_MATCH_1}" PARENT_SCOPE)
    if(NOT CMAKE_MATCH_1)
      list(APPEND missing "a ptxas that runs (${PE_CUDA12_NVCC_DIR}/bin/ptxas)")
    elseif(CMAKE_MATCH_1 VERSION_GREATER PE_CUDA12_MAX_VERSION
           OR CMAKE_MATCH_1 VERSION_LESS 12.0)
      list(APPEND missing
        "ptxas of CUDA 12.0-${PE_CUDA12_MAX_VERSION} (found ${CMAKE_MATCH_1})")
    endif()
  endif()
  if(missing)
    set(PE_CUDA12_FOUND OFF PARENT_SCOPE)
  else()
    set(PE_CUDA12_FOUND ON PARENT_SCOPE)
  endif()
  set(PE_CUDA12_MISSING "${missing}" PARENT_SCOPE)
endfunction()

# The CUDA root clang is given: links to the pieces, and the fatbinary stand-in.
function(_pe_make_cuda12_root root)
  file(MAKE_DIRECTORY "${root}/bin" "${root}/nvvm")
  file(CREATE_LINK "${PE_CUDA12_INCLUDE_DIR}" "${root}/include" SYMBOLIC)
  file(CREATE_LINK "${PE_CUDA12_NVCC_DIR}/bin/ptxas" "${root}/bin/ptxas" SYMBOLIC)
  file(CREATE_LINK "${PE_CUDA12_NVCC_DIR}/nvvm/libdevice" "${root}/nvvm/libdevice" SYMBOLIC)
  configure_file("${PROJECT_SOURCE_DIR}/build_tools/cuda12/fatbinary" "${root}/bin/fatbinary"
    @ONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
    WORLD_READ WORLD_EXECUTE)
endfunction()

# pe_add_cuda12_clang_library(TARGET ARCHITECTURES SOURCES... DEPENDS headers...)
# ARCHITECTURES as CMAKE_CUDA_ARCHITECTURES: "75-real" is SASS only, "90" SASS
# and PTX.
function(pe_add_cuda12_clang_library target architectures)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS" ${ARGN})
  set(root "${CMAKE_CURRENT_BINARY_DIR}/cuda12_root")
  _pe_make_cuda12_root("${root}")
  set(arch_flags "")
  foreach(arch IN LISTS architectures)
    if(arch MATCHES "^([0-9]+)-real$")
      list(APPEND arch_flags "--cuda-gpu-arch=sm_${CMAKE_MATCH_1}"
        "--no-cuda-include-ptx=sm_${CMAKE_MATCH_1}")
    elseif(arch MATCHES "^([0-9]+)$")
      list(APPEND arch_flags "--cuda-gpu-arch=sm_${CMAKE_MATCH_1}"
        "--cuda-include-ptx=sm_${CMAKE_MATCH_1}")
    else()
      message(FATAL_ERROR "PE_CUDA_ARCHITECTURES: '${arch}' is not NN or NN-real")
    endif()
  endforeach()
  set(flags -x cuda "--cuda-path=${root}" -isystem "${PE_CUDA12_CCCL_DIR}"
    ${arch_flags} -std=c++17 -O3 -DNDEBUG -fPIC -fvisibility=hidden
    "-I${PROJECT_SOURCE_DIR}" -Wall -Wextra -Wno-unknown-cuda-version)
  if(PE_WERROR)
    list(APPEND flags -Werror)
  endif()
  set(objects "")
  foreach(source IN LISTS ARG_SOURCES)
    get_filename_component(name "${source}" NAME_WE)
    set(object "${CMAKE_CURRENT_BINARY_DIR}/cuda12_objects/${name}.o")
    add_custom_command(
      OUTPUT "${object}"
      COMMAND "${CMAKE_COMMAND}" -E make_directory "${CMAKE_CURRENT_BINARY_DIR}/cuda12_objects"
      COMMAND ${CMAKE_CXX_COMPILER_LAUNCHER} "${PE_CLANG_CUDA_COMPILER}" ${flags}
        -c "${PROJECT_SOURCE_DIR}/${source}"
        -o "${object}"
      DEPENDS "${PROJECT_SOURCE_DIR}/${source}" ${ARG_DEPENDS}
        "${PROJECT_SOURCE_DIR}/build_tools/cuda12/fatbinary"
      COMMENT "clang CUDA 12 (${architectures}): ${source}"
      VERBATIM)
    list(APPEND objects "${object}")
  endforeach()
  add_library(${target} STATIC ${objects})
  set_source_files_properties(${objects} PROPERTIES EXTERNAL_OBJECT ON GENERATED ON)
  set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  target_include_directories(${target} PUBLIC "${PROJECT_SOURCE_DIR}")
endfunction()
