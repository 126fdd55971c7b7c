// The one way the CUDA cores launch a kernel:
//
//   PE_LAUNCH(blocks, threads, shared_bytes, stream, Kernel<T,
//   Index>)(args...);
//
// A CUDA compiler sees `Kernel<T, Index><<<blocks, threads, shared_bytes,
// stream>>>(args...)`, token for token, so the device code is what the
// launch syntax gives. The SIMT emulator (cc/simt/, PE_SIMT) compiles the
// same sources as host C++, where `<<<...>>>` does not parse: there the macro
// hands the kernel, its name and the launch site to the emulator's launcher.
// The kernel comes last because a template's arguments hold commas.
#ifndef PARTIAL_EMBEDDING_CC_CORE_GPU_LAUNCH_H_
#define PARTIAL_EMBEDDING_CC_CORE_GPU_LAUNCH_H_

#if defined(PE_SIMT)
#define PE_LAUNCH(grid, block, shared_bytes, stream, ...)                   \
  ::pe_simt::Launch(#__VA_ARGS__, __FILE__, __LINE__, &__VA_ARGS__, (grid), \
                    (block), (shared_bytes), (stream))
#else
#define PE_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif

#endif  // PARTIAL_EMBEDDING_CC_CORE_GPU_LAUNCH_H_
