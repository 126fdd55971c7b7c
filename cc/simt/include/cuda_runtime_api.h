// The SIMT emulator's stand-in: the runtime API lives in cuda_runtime.h.
#include "cuda_runtime.h"
