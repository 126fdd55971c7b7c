# Finds TensorFlow's headers and framework library through tf.sysconfig.
#
# Needs Python3_EXECUTABLE. Defines TensorFlow_FOUND, TensorFlow_VERSION,
# TensorFlow_DEFINITIONS (the -D flags of tf.sysconfig, e.g. the C++ ABI) and
# the imported target TensorFlow::framework, whose include directories are
# marked SYSTEM so TensorFlow's own warnings do not drown ours.
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='3'; import tensorflow as tf; s=tf.sysconfig; print('PE_TF_VERSION=' + tf.__version__); print('PE_TF_CFLAGS=' + '|'.join(s.get_compile_flags())); print('PE_TF_LFLAGS=' + '|'.join(s.get_link_flags()))"
  OUTPUT_VARIABLE _tf_out
  ERROR_QUIET
  RESULT_VARIABLE _tf_result)

if(_tf_result EQUAL 0)
  # TensorFlow may print to stdout while importing: read only our own lines.
  string(REGEX MATCH "PE_TF_VERSION=([^\n]*)" _ "${_tf_out}")
  set(TensorFlow_VERSION "${CMAKE_MATCH_1}")
  string(REGEX MATCH "PE_TF_CFLAGS=([^\n]*)" _ "${_tf_out}")
  set(_tf_cflags "${CMAKE_MATCH_1}")
  string(REGEX MATCH "PE_TF_LFLAGS=([^\n]*)" _ "${_tf_out}")
  set(_tf_lflags "${CMAKE_MATCH_1}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(TensorFlow
  REQUIRED_VARS TensorFlow_VERSION
  VERSION_VAR TensorFlow_VERSION)

if(TensorFlow_FOUND AND NOT TARGET TensorFlow::framework)
  string(REPLACE "|" ";" _tf_cflags "${_tf_cflags}")
  string(REPLACE "|" ";" _tf_lflags "${_tf_lflags}")
  set(_tf_includes "")
  set(_tf_defines "")
  set(_tf_options "")
  foreach(flag IN LISTS _tf_cflags)
    if(flag MATCHES "^-I(.*)")
      list(APPEND _tf_includes "${CMAKE_MATCH_1}")
    elseif(flag MATCHES "^-D(.*)")
      list(APPEND _tf_defines "${CMAKE_MATCH_1}")
    elseif(flag MATCHES "^--?std=")
      # The language standard is set by the project (C++17, as TF requires).
    else()
      list(APPEND _tf_options "${flag}")
    endif()
  endforeach()
  set(_tf_libdirs "")
  set(_tf_libs "")
  foreach(flag IN LISTS _tf_lflags)
    if(flag MATCHES "^-L(.*)")
      list(APPEND _tf_libdirs "${CMAKE_MATCH_1}")
    elseif(flag MATCHES "^-l:(.*)")
      list(APPEND _tf_libs "${CMAKE_MATCH_1}")
    elseif(flag MATCHES "^-l(.*)")
      list(APPEND _tf_libs "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(TensorFlow_DEFINITIONS "${_tf_defines}")
  list(GET _tf_libdirs 0 TensorFlow_LIBRARY_DIR)
  list(GET _tf_libs 0 _tf_framework_name)
  list(GET _tf_includes 0 TensorFlow_INCLUDE_DIR)
  add_library(TensorFlow::framework SHARED IMPORTED)
  set_target_properties(TensorFlow::framework PROPERTIES
    IMPORTED_LOCATION "${TensorFlow_LIBRARY_DIR}/${_tf_framework_name}"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_tf_includes}"
    INTERFACE_INCLUDE_DIRECTORIES "${_tf_includes}"
    INTERFACE_COMPILE_DEFINITIONS "${_tf_defines}"
    INTERFACE_COMPILE_OPTIONS "${_tf_options}")
endif()
