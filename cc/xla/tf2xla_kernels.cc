// The tf2xla kernels of cc/xla as one translation unit. Each kernel file
// alone spends about 26 s of the compiler's time in the tf2xla and XLA headers
// they share and well under a second in its own code, so the two are compiled
// here, once, instead of one compile each (CMakeLists.txt lists this file, not
// them). Each file keeps its names in a namespace of its own, so that they
// also compile on their own.
#include "cc/xla/masked_scatter_sub_xla_kernel.cc"  // NOLINT(build/include)
#include "cc/xla/masked_sparse_apply_rule_xla_kernel.cc"  // NOLINT(build/include)
