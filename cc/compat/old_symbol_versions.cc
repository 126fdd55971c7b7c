// Keeps the shared libraries' glibc and libstdc++ symbol versions at or below
// those of manylinux_2_27 (glibc 2.27, GLIBCXX_3.4.24, CXXABI_1.3.11), the
// policy TensorFlow 2.21's own wheels meet, while building with this
// machine's newer glibc (2.36) and g++ 12 headers.
//
// Every library CMake links gets this object and one `--wrap=NAME` per
// `__wrap_NAME` defined below (build_tools/cmake/PeSymbolVersions.cmake reads
// the names from this file): the linker then sends our objects' references to
// NAME here instead, and each wrapper calls an old version of the same
// function, or does its job without the new symbol. Everything here is
// hidden: nothing is exported, and libstdc++'s own calls are not affected.
// tests/package/test_symbol_versions.py reads every shipped library with
// objdump and fails on any version above the wheel's tag.
//
// The symbols, as `objdump -T` shows them without this file:
//   pthread_once                   GLIBC_2.34 (moved into libc.so.6 then;
//                                  GLIBC_2.2.5 is the same function)
//   __libc_single_threaded         GLIBC_2.32 (a variable libstdc++'s inline
//                                  reference counts read; older glibc has none)
//   std::condition_variable::wait  GLIBCXX_3.4.30 (GLIBCXX_3.4.11: the same
//                                  function, before g++ 12 gave it a new
//                                  version)
//   std::exception_ptr::_M_addref, _M_release   CXXABI_1.3.13 (g++ 12 made the
//                                  copy and the destructor inline callers of
//                                  these; older libraries export the copy
//                                  constructor and the destructor themselves)
//   pow                            GLIBC_2.29 (glibc 2.29's version drops the
//                                  old error-handling wrapper; GLIBC_2.2.5 is
//                                  the same computation: FTRL's exponent)
//   std::__throw_bad_array_new_length   GLIBCXX_3.4.29 (new in g++ 11)
//   std::stringstream::stringstream()   GLIBCXX_3.4.26 (g++ 9 gave the default
//                                  constructor a symbol of its own; XLA's FFI
//                                  headers build one to decode attributes)

#if !defined(__x86_64__) || !defined(__linux__)
#error "old_symbol_versions.cc is for x86_64 Linux (glibc) only"
#endif

#include <pthread.h>

#include <cstring>
#include <ios>
#include <new>

#if !defined(__GLIBC__) || !defined(__GLIBCXX__)
#error "old_symbol_versions.cc needs glibc and libstdc++"
#endif

#define PE_HIDDEN __attribute__((visibility("hidden")))

// The old versions, under names of our own that the assembler binds to
// NAME@VERSION. Default visibility even where a target hides everything: a
// hidden reference would not be renamed, and would stay undefined.
#define PE_LIBRARY_SYMBOL __attribute__((visibility("default")))
extern "C" {
PE_LIBRARY_SYMBOL int pe_pthread_once_2_2_5(pthread_once_t* once,
                                            void (*init)(void));
PE_LIBRARY_SYMBOL void pe_condition_variable_wait_3_4_11(
    void* condition_variable, void* lock);
PE_LIBRARY_SYMBOL void pe_exception_ptr_copy_1_3_3(void* self,
                                                   const void* other) noexcept;
PE_LIBRARY_SYMBOL void pe_exception_ptr_destroy_1_3_3(void* self) noexcept;
PE_LIBRARY_SYMBOL double pe_pow_2_2_5(double base, double exponent);
// std::stringstream::stringstream(std::ios_base::openmode), GLIBCXX_3.4.21:
// its only version, so bound by name.
void _ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1ESt13_Ios_Openmode(
    void* self, std::ios_base::openmode mode);
}
__asm__(".symver pe_pthread_once_2_2_5, pthread_once@GLIBC_2.2.5");
__asm__(".symver pe_pow_2_2_5, pow@GLIBC_2.2.5");
__asm__(
    ".symver pe_condition_variable_wait_3_4_11, "
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
__asm__(
    ".symver pe_exception_ptr_copy_1_3_3, "
    "_ZNSt15__exception_ptr13exception_ptrC1ERKS0_@CXXABI_1.3.3");
__asm__(
    ".symver pe_exception_ptr_destroy_1_3_3, "
    "_ZNSt15__exception_ptr13exception_ptrD1Ev@CXXABI_1.3.3");

extern "C" {

// False: "other threads may exist", so reference counts always use atomic
// operations, which is always correct (glibc < 2.32 gives libstdc++ no
// cheaper answer either, and TensorFlow's process is never single-threaded).
PE_HIDDEN char __wrap___libc_single_threaded = 0;

PE_HIDDEN int __wrap_pthread_once(pthread_once_t* once, void (*init)(void)) {
  return pe_pthread_once_2_2_5(once, init);
}

PE_HIDDEN double __wrap_pow(double base, double exponent) {
  return pe_pow_2_2_5(base, exponent);
}

// std::condition_variable::wait(std::unique_lock<std::mutex>&)
PE_HIDDEN void __wrap__ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE(
    void* condition_variable, void* lock) {
  pe_condition_variable_wait_3_4_11(condition_variable, lock);
}

// std::__exception_ptr::exception_ptr::_M_addref(): one more reference, taken
// by the library's copy constructor into a copy that is never destroyed.
PE_HIDDEN void __wrap__ZNSt15__exception_ptr13exception_ptr9_M_addrefEv(
    void* self) noexcept {
  alignas(void*) unsigned char kept_copy[sizeof(void*)];
  pe_exception_ptr_copy_1_3_3(kept_copy, self);
}

// std::__exception_ptr::exception_ptr::_M_release(): the library's destructor,
// run on a copy of the pointer (the caller still owns `self`'s storage).
PE_HIDDEN void __wrap__ZNSt15__exception_ptr13exception_ptr10_M_releaseEv(
    void* self) noexcept {
  alignas(void*) unsigned char released[sizeof(void*)];
  std::memcpy(released, self, sizeof(released));
  pe_exception_ptr_destroy_1_3_3(released);
}

// std::__throw_bad_array_new_length()
[[noreturn]] PE_HIDDEN void __wrap__ZSt28__throw_bad_array_new_lengthv() {
  throw std::bad_array_new_length();
}

// std::stringstream::stringstream(): the constructor with in | out, which the
// default constructor is. (One line: CMake reads the name from it.)
// clang-format off
PE_HIDDEN void __wrap__ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev(void* self) {
  // clang-format on
  _ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1ESt13_Ios_Openmode(
      self, std::ios_base::in | std::ios_base::out);
}

}  // extern "C"
