// The SIMT emulator has no half-precision device types: the cores use their
// host arithmetic paths (__CUDA_ARCH__ stays undefined).
