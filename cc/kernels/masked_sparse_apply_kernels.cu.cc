// The GPU specialization of MaskedSparseApplyRuleFunctor: hands TensorFlow's
// own stream, the tensors' device pointers (the hyperparameters too: no copy
// to the host) and a TensorFlow-allocated workspace to the TF-free CUDA core,
// which applies any rule of the table (cc/core/row_rules.h), then reads
// whether the core refused the step.
//
// No device code here: the host C++ compiler builds this file, and every CUDA
// call happens inside the core (see masked_scatter_sub_kernels.cu.cc).
#if GOOGLE_CUDA

#include "cc/kernels/masked_sparse_apply_kernels.h"

#include <cstdint>

#include "cc/core/masked_sparse_apply_gpu.h"
#include "cc/kernels/gpu_stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "MaskedSparseApplyRule";

}  // namespace

template <typename T, typename Index>
struct MaskedSparseApplyRuleFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedSparseApplyRuleArgs<T, Index>& args,
                          RuleInputError* error,
                          RuleErrorValues* values) const {
    using CoreT = CoreOf<T>;
    *error = RuleInputError();
    *values = RuleErrorValues();
    if (args.num_indices == 0) return absl::OkStatus();
    const bool compact = args.slot_indices != nullptr;
    GpuCall call;
    TF_RETURN_IF_ERROR(StartGpuCall(
        ctx, kOpName, "indices", "positions", args.num_indices, kMaxGpuIndices,
        [&](GpuStream stream, size_t* bytes) {
          return MaskedSparseApplyRuleGpuWorkspaceBytes<CoreT>(
              args.num_rows, args.row_size, args.num_indices,
              compact ? args.num_slot_rows : 0, stream, bytes);
        },
        &call));
    // Unlike the CPU kernel, a buffer a reader still holds is copied before
    // the indices are checked (on the device, in the same stream): a refused
    // step then leaves the variable a new buffer with the same values.
    TF_RETURN_IF_ERROR(CopySharedTables<GPUDevice>(ctx, *args.tables));
    SlotMap<Index> slot_map;
    slot_map.slot_indices = args.slot_indices;
    slot_map.num_slot_rows = args.num_slot_rows;
    // The core reads the rule's own hyperparameters only: the tensor holds
    // exactly those.
    TF_RETURN_IF_ERROR(
        GpuStatus(MaskedSparseApplyRuleGpuAsync<CoreT, Index>(
                      args.rule,
                      CoreTables<T>(*args.tables, args.rule, args.num_rows,
                                    args.row_size),
                      args.indices, args.num_indices, slot_map,
                      reinterpret_cast<const CoreT*>(args.grad), args.row_mask,
                      reinterpret_cast<const CoreT*>(args.hyperparameters),
                      call.workspace_data(), call.workspace_bytes, call.stream),
                  kOpName, "the GPU kernel"));
    // Waits for the stream: the workspace stays alive until the step has run.
    return GpuStatus(
        ReadGpuRuleInputError(call.workspace_data(), args.indices,
                              args.slot_indices, call.stream, error, values),
        kOpName, "reading the step's checks");
  }
};

#define PE_INSTANTIATE_GPU(T, Index) \
  template struct MaskedSparseApplyRuleFunctor<GPUDevice, T, Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
