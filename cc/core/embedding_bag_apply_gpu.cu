// CUDA implementation of the fused bag backward + rule step: host code that
// chains the bag gradient's values call and the rule step on one stream (the
// design is described in embedding_bag_apply_gpu.h). No kernel of its own:
// each half keeps the one implementation its core has.
#include <cuda_runtime.h>

#include <cstdint>

#include "cc/core/embedding_bag_apply_gpu.h"
#include "cc/core/gpu_device_common.cuh"
#include "cc/core/masked_sparse_apply_gpu.h"

namespace partial_embedding {
namespace {

using gpu::AlignUp;

// Where each buffer lives in the workspace: the rule step's own workspace
// first (WriteGpuRuleHyperparameters writes into its header), then the rows
// and their summed gradients, which the step reads as its indices and
// gradient.
struct Layout {
  size_t step_bytes = 0;
  size_t rows = 0;
  size_t values = 0;
  size_t total = 0;
};

template <typename T, typename Index>
cudaError_t ComputeLayout(int64_t num_rows, int64_t row_size,
                          int64_t num_groups, GpuStream stream,
                          Layout* layout) {
  *layout = Layout();
  if (num_rows < 0 || row_size < 0 || num_groups < 0) {
    return cudaErrorInvalidValue;
  }
  const auto error =
      static_cast<cudaError_t>(MaskedSparseApplyRuleGpuWorkspaceBytes<T>(
          num_rows, row_size, num_groups, 0, stream, &layout->step_bytes));
  if (error != cudaSuccess) return error;
  const size_t groups = static_cast<size_t>(num_groups);
  layout->rows = AlignUp(layout->step_bytes);
  layout->values = layout->rows + AlignUp(groups * sizeof(Index));
  layout->total = layout->values +
                  AlignUp(groups * static_cast<size_t>(row_size) * sizeof(T));
  return cudaSuccess;
}

}  // namespace

template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_groups, GpuStream stream,
                                           size_t* bytes) {
  Layout layout;
  const cudaError_t error =
      ComputeLayout<T, Index>(num_rows, row_size, num_groups, stream, &layout);
  *bytes = layout.total;
  return error;
}

template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuAsync(Rule rule, const RuleTables<T>& tables,
                                  const T* grad,
                                  const BagPositions<Index>& positions,
                                  const typename Arith<T>::Compute* factors,
                                  const bool* row_mask,
                                  const T* hyperparameters, int64_t num_groups,
                                  const void* plan_workspace,
                                  size_t plan_workspace_bytes, void* workspace,
                                  size_t workspace_bytes, GpuStream stream) {
  // The plan grouped ids of a table of positions.num_rows rows: the step
  // must write that table.
  if (positions.num_rows != tables.num_rows ||
      static_cast<uint32_t>(rule) >= static_cast<uint32_t>(kNumRules)) {
    return cudaErrorInvalidValue;
  }
  if (num_groups == 0 || tables.row_size == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  Layout layout;
  cudaError_t error = ComputeLayout<T, Index>(tables.num_rows, tables.row_size,
                                              num_groups, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  char* scratch = static_cast<char*>(workspace);
  auto* rows = reinterpret_cast<Index*>(scratch + layout.rows);
  auto* values = reinterpret_cast<T*>(scratch + layout.values);
  error = static_cast<cudaError_t>(EmbeddingBagGradGpuValues<T, Index>(
      grad, tables.row_size, positions, factors, num_groups, plan_workspace,
      plan_workspace_bytes, rows, values, stream));
  if (error != cudaSuccess) return error;
  // The rows are distinct, in range and permitted: the step's own checks
  // pass, so nobody needs to read its error words.
  return MaskedSparseApplyRuleGpuAsync<T, Index>(
      rule, tables, rows, num_groups, SlotMap<Index>{}, values, row_mask,
      hyperparameters, workspace, layout.step_bytes, stream);
}

#define PE_INSTANTIATE(T, Index)                                         \
  template int EmbeddingBagApplyRuleGpuWorkspaceBytes<T, Index>(         \
      int64_t, int64_t, int64_t, GpuStream, size_t*);                    \
  template int EmbeddingBagApplyRuleGpuAsync<T, Index>(                  \
      Rule, const RuleTables<T>&, const T*, const BagPositions<Index>&,  \
      const typename Arith<T>::Compute*, const bool*, const T*, int64_t, \
      const void*, size_t, void*, size_t, GpuStream);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
