// partial_embedding._kernels: a pybind11 module over the TF-free core, for
// kernel microbenchmarks and for testing the GPU kernels without TensorFlow.
//
// CPU entry points take NumPy arrays; GPU entry points take any object with
// __cuda_array_interface__ (CuPy, PyTorch, Numba). Value dtypes: float16,
// float32, float64, and bfloat16 either as ml_dtypes.bfloat16 arrays (CPU) or
// as uint16/int16 arrays holding bfloat16 bits with dtype="bfloat16" (CPU and
// GPU; CuPy has no bfloat16 and PyTorch does not export it through the
// interface). Index dtypes: int32, int64. row_mask: bool. Every array must be
// C-contiguous.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/masked_scatter_sub.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/core/masked_sparse_apply_gpu.h"
#include "cc/core/quantized_lookup.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_contract.h"
#include "cc/python/arrays.h"
#if PE_WITH_CUDA
#include "cc/core/masked_scatter_sub_gpu.h"
#include "cc/core/quantized_lookup_gpu.h"
#endif
#ifndef PE_SIMT
#define PE_SIMT 0
#endif
#if PE_SIMT
#include "simt_runtime.h"
#endif

namespace partial_embedding {
namespace {

namespace py = ::pybind11;

// A validated call: the four arrays agree in shape and dtype.
struct Problem {
  ValueType value_type = ValueType::kFloat32;
  IndexType index_type = IndexType::kInt32;
  void* var = nullptr;
  const void* indices = nullptr;
  const void* updates = nullptr;
  const bool* row_mask = nullptr;
  int64_t num_rows = 0;
  int64_t row_size = 1;
  int64_t num_indices = 1;
  std::vector<int64_t> indices_shape;
};

Problem CheckProblem(const ArrayView& var, const ArrayView& indices,
                     const ArrayView& updates, const ArrayView& row_mask,
                     const std::optional<std::string>& dtype,
                     const std::string& updates_name = "updates") {
  Problem problem;
  problem.value_type = ResolveValueType(var, "var", dtype);
  if (ResolveValueType(updates, updates_name.c_str(), dtype) !=
          problem.value_type ||
      updates.itemsize != var.itemsize) {
    throw py::value_error(updates_name + ": dtype " + updates.dtype_name +
                          " does not match var's dtype " + var.dtype_name);
  }
  if (!var.writable) throw py::value_error("var: must be writable");
  if (indices.kind != 'i' || (indices.itemsize != 4 && indices.itemsize != 8)) {
    throw py::value_error("indices: dtype " + indices.dtype_name +
                          " is not int32 or int64");
  }
  problem.index_type =
      indices.itemsize == 4 ? IndexType::kInt32 : IndexType::kInt64;
  if (row_mask.kind != 'b' || row_mask.itemsize != 1) {
    throw py::value_error("row_mask: dtype " + row_mask.dtype_name +
                          " is not bool");
  }
  // The shapes: the row-update contract of cc/core/row_update_contract.h.
  ThrowIfError(
      CheckRowUpdateShapes({var.shape, row_mask.shape, indices.shape,
                            updates.shape, "var", updates_name.c_str()},
                           ShapeNotation::kNumPy));
  problem.num_rows = var.shape[0];
  for (size_t d = 1; d < var.shape.size(); ++d)
    problem.row_size *= var.shape[d];
  for (const int64_t dim : indices.shape) problem.num_indices *= dim;
  problem.var = var.data;
  problem.indices = indices.data;
  problem.updates = updates.data;
  problem.row_mask = static_cast<const bool*>(row_mask.data);
  problem.indices_shape = indices.shape;
  return problem;
}

// Calls f(Tag<T>, Tag<Index>) with the core's types for this problem.
template <typename F>
void Dispatch(const Problem& problem, F&& f) {
  DispatchTypes(problem.value_type, problem.index_type, std::forward<F>(f));
}

[[noreturn]] void ThrowBadIndex(const Problem& problem, int64_t position,
                                int64_t value) {
  std::string coords;
  int64_t flat = position;
  const auto& shape = problem.indices_shape;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    const int64_t size = std::max<int64_t>(shape[d], 1);
    coords =
        std::to_string(flat % size) + (coords.empty() ? "" : ", ") + coords;
    flat /= size;
  }
  if (shape.empty()) coords = "0";
  throw py::index_error("indices[" + coords + "] = " + std::to_string(value) +
                        " is not in [0, " + std::to_string(problem.num_rows) +
                        "); nothing was written");
}

void MaskedScatterSubCpuPy(const py::array& var, const py::array& indices,
                           const py::array& updates, const py::array& row_mask,
                           int num_threads,
                           const std::optional<std::string>& dtype) {
  const Problem problem = CheckProblem(
      ViewNumpy(var, "var"), ViewNumpy(indices, "indices"),
      ViewNumpy(updates, "updates"), ViewNumpy(row_mask, "row_mask"), dtype);
  int64_t bad_position = -1;
  int64_t bad_value = 0;
  {
    py::gil_scoped_release release;
    Dispatch(problem, [&](auto value_tag, auto index_tag) {
      using T = typename decltype(value_tag)::type;
      using Index = typename decltype(index_tag)::type;
      const auto* indices_data = static_cast<const Index*>(problem.indices);
      bad_position = MaskedScatterSubCpu(
          static_cast<T*>(problem.var), problem.num_rows, problem.row_size,
          indices_data, problem.num_indices,
          static_cast<const T*>(problem.updates), problem.row_mask,
          PlainThreads(Threads(num_threads)));
      if (bad_position >= 0) bad_value = indices_data[bad_position];
    });
  }
  if (bad_position >= 0) ThrowBadIndex(problem, bad_position, bad_value);
}

// The arrays of one rule's step besides var, indices, gradient and row_mask,
// checked against the rule's row of the table (row_rules.h).
struct RuleArrays {
  Rule rule = Rule::kSgd;
  void* slots[kMaxSlots] = {};
  const void* slot_indices = nullptr;
  int64_t num_slot_rows = 0;
};

RuleArrays CheckRuleArrays(const Problem& problem, const std::string& rule_name,
                           const ArrayView& var, const ArrayView& indices,
                           const std::vector<ArrayView>& slots,
                           const std::optional<ArrayView>& slot_indices,
                           const std::optional<std::string>& dtype) {
  RuleArrays arrays;
  ThrowIfError(
      RuleOfAttrs(rule_name, static_cast<int64_t>(slots.size()), &arrays.rule));
  const RuleInfo& info = InfoOf(arrays.rule);
  // What only the arrays show (dtype, writability) is checked here; the
  // shapes by the slot contract of cc/core/row_update_contract.h.
  std::vector<SlotShape> shapes;
  for (int i = 0; i < info.num_slots; ++i) {
    const ArrayView& slot = slots[i];
    const std::string name = info.slot_names[i];
    if (ResolveValueType(slot, name.c_str(), dtype) != problem.value_type ||
        slot.itemsize != var.itemsize) {
      throw py::value_error(name + ": dtype " + slot.dtype_name +
                            " does not match var's dtype " + var.dtype_name);
    }
    if (!slot.writable) throw py::value_error(name + ": must be writable");
    shapes.push_back({info.slot_names[i], slot.shape, info.per_row[i]});
    arrays.slots[i] = slot.data;
  }
  const bool compact = slot_indices.has_value();
  ThrowIfError(
      CheckSlotShapes(var.shape, shapes, compact, ShapeNotation::kNumPy));
  if (compact) {
    const ArrayView& map = *slot_indices;
    if (info.num_slots == 0) {
      throw py::value_error("slot_indices: rule '" + rule_name +
                            "' has no slots to map");
    }
    if (map.kind != indices.kind || map.itemsize != indices.itemsize) {
      throw py::value_error("slot_indices: dtype " + map.dtype_name +
                            " does not match indices' dtype " +
                            indices.dtype_name);
    }
    ThrowIfError(
        CheckSlotIndicesShape(indices.shape, map.shape, ShapeNotation::kNumPy));
    arrays.slot_indices = map.data;
    arrays.num_slot_rows = slots[0].shape[0];
  }
  return arrays;
}

// The message of a refused step, naming the values read where the indices
// live (ErrorValuesOf on the host, ReadGpuRuleInputError on the GPU).
[[noreturn]] void ThrowRuleInputError(const Problem& problem,
                                      const RuleInputError& error,
                                      const RuleErrorValues& values,
                                      int64_t num_slot_rows) {
  const std::string at = "[" + std::to_string(error.position) + "]";
  const std::string earlier = "[" + std::to_string(error.earlier) + "]";
  switch (error.kind) {
    case RuleInputError::Kind::kIndexOutOfRange:
      ThrowBadIndex(problem, error.position, values.index_at_position);
    case RuleInputError::Kind::kSlotIndexOutOfRange:
      throw py::index_error("slot_indices" + at + " = " +
                            std::to_string(values.slot_at_position) +
                            " is not in [0, " + std::to_string(num_slot_rows) +
                            "); nothing was written");
    case RuleInputError::Kind::kRowInTwoSlotRows:
      throw py::value_error("indices" + earlier + " and indices" + at +
                            " hold the same row with different slot rows; "
                            "nothing was written");
    case RuleInputError::Kind::kSlotRowOfTwoRows:
      throw py::value_error("slot_indices" + earlier + " and slot_indices" +
                            at +
                            " give two rows the same slot row; nothing "
                            "was written");
    case RuleInputError::Kind::kNone:
      break;
  }
  throw py::value_error("unexpected input error");
}

// The views of one rule's step, checked: the problem (var, indices, gradient,
// row_mask), the slots, and the hyperparameters as Python gives them.
struct RuleProblem {
  Problem problem;
  RuleArrays arrays;
  std::vector<double> hyperparameters;

  template <typename T>
  RuleTables<T> Tables() const {
    RuleTables<T> tables;
    tables.var = static_cast<T*>(problem.var);
    for (int i = 0; i < kMaxSlots; ++i) {
      tables.slots[i] = static_cast<T*>(arrays.slots[i]);
    }
    tables.num_rows = problem.num_rows;
    tables.row_size = problem.row_size;
    return tables;
  }

  template <typename Index>
  SlotMap<Index> Map() const {
    return {static_cast<const Index*>(arrays.slot_indices),
            arrays.num_slot_rows};
  }
};

RuleProblem CheckRuleProblem(const std::string& rule, const ArrayView& var,
                             const std::vector<ArrayView>& slots,
                             const ArrayView& indices,
                             const std::optional<ArrayView>& slot_indices,
                             const ArrayView& gradient,
                             const ArrayView& row_mask,
                             const std::vector<double>& hyperparameters,
                             const std::optional<std::string>& dtype) {
  RuleProblem checked;
  checked.problem =
      CheckProblem(var, indices, gradient, row_mask, dtype, "gradient");
  checked.arrays = CheckRuleArrays(checked.problem, rule, var, indices, slots,
                                   slot_indices, dtype);
  ThrowIfError(CheckHyperparametersShape(
      checked.arrays.rule, {static_cast<int64_t>(hyperparameters.size())},
      ShapeNotation::kNumPy));
  checked.hyperparameters = hyperparameters;
  return checked;
}

void MaskedSparseApplyRuleCpuPy(
    const std::string& rule, const py::array& var,
    const std::vector<py::array>& slots, const py::array& indices,
    const std::optional<py::array>& slot_indices, const py::array& gradient,
    const py::array& row_mask, const std::vector<double>& hyperparameters,
    int num_threads, const std::optional<std::string>& dtype) {
  std::optional<ArrayView> map;
  if (slot_indices.has_value()) map = ViewNumpy(*slot_indices, "slot_indices");
  const RuleProblem checked = CheckRuleProblem(
      rule, ViewNumpy(var, "var"), ViewSlots(slots, ViewNumpy),
      ViewNumpy(indices, "indices"), map, ViewNumpy(gradient, "gradient"),
      ViewNumpy(row_mask, "row_mask"), hyperparameters, dtype);
  RuleInputError error;
  RuleErrorValues values;
  {
    py::gil_scoped_release release;
    Dispatch(checked.problem, [&](auto value_tag, auto index_tag) {
      using T = typename decltype(value_tag)::type;
      using Index = typename decltype(index_tag)::type;
      const SlotMap<Index> slot_map = checked.Map<Index>();
      const auto* index_data =
          static_cast<const Index*>(checked.problem.indices);
      error = MaskedSparseApplyRuleCpu<T, Index>(
          checked.arrays.rule, checked.Tables<T>(), index_data,
          checked.problem.num_indices, slot_map,
          static_cast<const T*>(checked.problem.updates),
          checked.problem.row_mask,
          RoundedHyperparameters<T>(checked.hyperparameters),
          PlainThreads(Threads(num_threads)));
      values = ErrorValuesOf(error, index_data, slot_map.slot_indices);
    });
  }
  if (!error.ok()) {
    ThrowRuleInputError(checked.problem, error, values,
                        checked.arrays.num_slot_rows);
  }
}

// A checked quantized lookup: the core's inputs with the ids' type erased,
// and the outputs.
struct QuantizedProblem {
  IndexType index_type = IndexType::kInt32;
  QuantizedLookupInputs<void> in;
  float* out = nullptr;
  int32_t* row_of = nullptr;
};

QuantizedProblem CheckQuantizedProblem(
    const ArrayView& codes, const ArrayView& scales, const ArrayView& store,
    const ArrayView& sorted_ids, const ArrayView& store_index,
    const ArrayView& ids, const ArrayView& out, const ArrayView& row_of) {
  const auto require = [](const ArrayView& view, const char* name, char kind,
                          int64_t itemsize, const char* dtype,
                          const std::vector<int64_t>& shape) {
    if (view.kind != kind || view.itemsize != itemsize) {
      throw py::value_error(std::string(name) + ": dtype " + view.dtype_name +
                            " is not " + dtype);
    }
    if (view.shape != shape) {
      throw py::value_error(std::string(name) + ": shape " +
                            ShapeString(view.shape) + " must be " +
                            ShapeString(shape));
    }
  };
  if (codes.shape.size() != 2 || store.shape.size() != 2 ||
      ids.shape.size() != 1) {
    throw py::value_error(
        "codes and store must be 2-D ([V, D], [S, D]) and ids 1-D");
  }
  const int64_t num_rows = codes.shape[0];
  const int64_t width = codes.shape[1];
  const int64_t store_rows = store.shape[0];
  const int64_t num_ids = ids.shape[0];
  if (store_rows < 1) {
    throw py::value_error("store: needs at least its sentinel row");
  }
  require(codes, "codes", 'i', 1, "int8", {num_rows, width});
  require(scales, "scales", 'f', 4, "float32", {num_rows});
  require(store, "store", 'f', 4, "float32", {store_rows, width});
  require(sorted_ids, "sorted_ids", 'i', 4, "int32", {store_rows});
  require(store_index, "store_index", 'i', 4, "int32", {store_rows});
  require(out, "out", 'f', 4, "float32", {num_ids, width});
  require(row_of, "row_of", 'i', 4, "int32", {num_ids});
  if (ids.kind != 'i' || (ids.itemsize != 4 && ids.itemsize != 8)) {
    throw py::value_error("ids: dtype " + ids.dtype_name +
                          " is not int32 or int64");
  }
  if (!out.writable || !row_of.writable) {
    throw py::value_error("out and row_of must be writable");
  }
  QuantizedProblem problem;
  problem.index_type =
      ids.itemsize == 4 ? IndexType::kInt32 : IndexType::kInt64;
  problem.in.codes = static_cast<const int8_t*>(codes.data);
  problem.in.scales = static_cast<const float*>(scales.data);
  problem.in.num_rows = num_rows;
  problem.in.width = width;
  problem.in.store = static_cast<const float*>(store.data);
  problem.in.store_rows = store_rows;
  problem.in.sorted_ids = static_cast<const int32_t*>(sorted_ids.data);
  problem.in.store_index = static_cast<const int32_t*>(store_index.data);
  problem.in.ids = ids.data;
  problem.in.num_ids = num_ids;
  problem.out = static_cast<float*>(out.data);
  problem.row_of = static_cast<int32_t*>(row_of.data);
  return problem;
}

template <typename Index>
QuantizedLookupInputs<Index> TypedInputs(const QuantizedProblem& problem) {
  QuantizedLookupInputs<Index> in;
  in.codes = problem.in.codes;
  in.scales = problem.in.scales;
  in.num_rows = problem.in.num_rows;
  in.width = problem.in.width;
  in.store = problem.in.store;
  in.store_rows = problem.in.store_rows;
  in.sorted_ids = problem.in.sorted_ids;
  in.store_index = problem.in.store_index;
  in.ids = static_cast<const Index*>(problem.in.ids);
  in.num_ids = problem.in.num_ids;
  return in;
}

// Calls f(Tag<Index>) with the ids' type.
template <typename F>
void DispatchIds(const QuantizedProblem& problem, F&& f) {
  if (problem.index_type == IndexType::kInt32) {
    f(Tag<int32_t>{});
  } else {
    f(Tag<int64_t>{});
  }
}

void ThrowIfQuantizedLookupRefused(const QuantizedProblem& problem,
                                   int64_t bad_position, int64_t bad_value) {
  if (bad_position < 0) return;
  if (bad_position == problem.in.num_ids) {
    throw py::value_error("store_index: a store row outside [0, " +
                          std::to_string(problem.in.store_rows) +
                          "); nothing was written");
  }
  throw py::index_error("ids[" + std::to_string(bad_position) +
                        "] = " + std::to_string(bad_value) + " is not in [0, " +
                        std::to_string(problem.in.num_rows) +
                        "); nothing was written");
}

void QuantizedLookupCpuPy(const py::array& codes, const py::array& scales,
                          const py::array& store, const py::array& sorted_ids,
                          const py::array& store_index, const py::array& ids,
                          const py::array& out, const py::array& row_of,
                          int num_threads) {
  const QuantizedProblem problem = CheckQuantizedProblem(
      ViewNumpy(codes, "codes"), ViewNumpy(scales, "scales"),
      ViewNumpy(store, "store"), ViewNumpy(sorted_ids, "sorted_ids"),
      ViewNumpy(store_index, "store_index"), ViewNumpy(ids, "ids"),
      ViewNumpy(out, "out"), ViewNumpy(row_of, "row_of"));
  int64_t bad_position = -1;
  int64_t bad_value = 0;
  {
    py::gil_scoped_release release;
    DispatchIds(problem, [&](auto index_tag) {
      using Index = typename decltype(index_tag)::type;
      const QuantizedLookupInputs<Index> in = TypedInputs<Index>(problem);
      bad_position = QuantizedLookupCpu(in, problem.out, problem.row_of,
                                        PlainThreads(Threads(num_threads)));
      if (bad_position >= 0 && bad_position < in.num_ids) {
        bad_value = static_cast<int64_t>(in.ids[bad_position]);
      }
    });
  }
  ThrowIfQuantizedLookupRefused(problem, bad_position, bad_value);
}

#if PE_WITH_CUDA

// Runs on the device of the problem's arrays (zero-size arrays may have a
// null data pointer: the first non-empty one decides).
void SelectDeviceOfProblem(const Problem& problem) {
  if (problem.num_rows > 0 && problem.row_size > 0) {
    SelectDeviceOf(problem.var, "var");
  } else if (problem.num_rows > 0) {
    SelectDeviceOf(problem.row_mask, "row_mask");
  } else if (problem.num_indices > 0) {
    SelectDeviceOf(problem.indices, "indices");
  }
}

// Runs the update `warmup + repeats` times (repeats = 0: once, untimed) and
// returns the mean milliseconds per timed call.
double RunGpu(const py::object& var, const py::object& indices,
              const py::object& updates, const py::object& row_mask,
              bool deterministic, uintptr_t stream_handle,
              const std::optional<std::string>& dtype, int warmup,
              int repeats) {
  const Problem problem = CheckProblem(
      ViewCuda(var, "var"), ViewCuda(indices, "indices"),
      ViewCuda(updates, "updates"), ViewCuda(row_mask, "row_mask"), dtype);
  if (problem.num_indices > kMaxGpuIndices) {
    throw py::value_error("indices: more than 2**31 - 1 positions");
  }
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  double milliseconds = 0.0;
  int64_t bad_position = -1;
  int64_t bad_value = 0;
  {
    py::gil_scoped_release release;
    SelectDeviceOfProblem(problem);
    Dispatch(problem, [&](auto value_tag, auto index_tag) {
      using T = typename decltype(value_tag)::type;
      using Index = typename decltype(index_tag)::type;
      size_t bytes = 0;
      CheckCuda(MaskedScatterSubGpuWorkspaceBytes<T>(
                    problem.num_rows, problem.row_size, problem.num_indices,
                    deterministic, stream, &bytes),
                "MaskedScatterSubGpuWorkspaceBytes");
      Workspace workspace(bytes, stream);
      auto run_once = [&] {
        CheckCuda(
            MaskedScatterSubGpuAsync(
                static_cast<T*>(problem.var), problem.num_rows,
                problem.row_size, static_cast<const Index*>(problem.indices),
                problem.num_indices, static_cast<const T*>(problem.updates),
                problem.row_mask, deterministic, workspace.data(),
                workspace.bytes(), stream),
            "MaskedScatterSubGpuAsync");
      };
      if (repeats <= 0) {
        run_once();
      } else {
        milliseconds = MeanMilliseconds(stream, warmup, repeats, run_once);
      }
      CheckCuda(ReadGpuBadIndex(workspace.data(),
                                static_cast<const Index*>(problem.indices),
                                stream, &bad_position, &bad_value),
                "ReadGpuBadIndex");
    });
  }
  if (bad_position >= 0) ThrowBadIndex(problem, bad_position, bad_value);
  return milliseconds;
}

double TimeDeviceCopy(const py::object& dst, const py::object& src, int warmup,
                      int repeats, uintptr_t stream_handle) {
  const ArrayView dst_view = ViewCuda(dst, "dst");
  const ArrayView src_view = ViewCuda(src, "src");
  int64_t dst_bytes = dst_view.itemsize;
  int64_t src_bytes = src_view.itemsize;
  for (const int64_t dim : dst_view.shape) dst_bytes *= dim;
  for (const int64_t dim : src_view.shape) src_bytes *= dim;
  if (dst_bytes != src_bytes || !dst_view.writable) {
    throw py::value_error("dst: must be writable and as large as src");
  }
  if (repeats <= 0) throw py::value_error("repeats: must be positive");
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  py::gil_scoped_release release;
  if (src_bytes > 0) SelectDeviceOf(dst_view.data, "dst");
  return MeanMilliseconds(stream, warmup, repeats, [&] {
    CheckCuda(
        GpuCopyDeviceToDevice(dst_view.data, src_view.data, src_bytes, stream),
        "copy");
  });
}

// One step of a rule on device arrays, `warmup + repeats` times (repeats = 0:
// once, untimed); returns the mean milliseconds per timed call. Raises as the
// CPU entry point does when the inputs are refused (nothing written).
double RunRuleGpu(const std::string& rule, const py::object& var,
                  const std::vector<py::object>& slots,
                  const py::object& indices, const py::object& slot_indices,
                  const py::object& gradient, const py::object& row_mask,
                  const std::vector<double>& hyperparameters,
                  uintptr_t stream_handle,
                  const std::optional<std::string>& dtype, int warmup,
                  int repeats) {
  std::optional<ArrayView> map;
  if (!slot_indices.is_none()) map = ViewCuda(slot_indices, "slot_indices");
  const RuleProblem checked = CheckRuleProblem(
      rule, ViewCuda(var, "var"), ViewSlots(slots, ViewCuda),
      ViewCuda(indices, "indices"), map, ViewCuda(gradient, "gradient"),
      ViewCuda(row_mask, "row_mask"), hyperparameters, dtype);
  if (checked.problem.num_indices > kMaxGpuIndices) {
    throw py::value_error("indices: more than 2**31 - 1 positions");
  }
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  double milliseconds = 0.0;
  RuleInputError error;
  RuleErrorValues values;
  {
    py::gil_scoped_release release;
    SelectDeviceOfProblem(checked.problem);
    Dispatch(checked.problem, [&](auto value_tag, auto index_tag) {
      using T = typename decltype(value_tag)::type;
      using Index = typename decltype(index_tag)::type;
      const RuleTables<T> tables = checked.Tables<T>();
      const SlotMap<Index> slot_map = checked.Map<Index>();
      const auto* index_data =
          static_cast<const Index*>(checked.problem.indices);
      size_t bytes = 0;
      CheckCuda(
          MaskedSparseApplyRuleGpuWorkspaceBytes<T>(
              tables.num_rows, tables.row_size, checked.problem.num_indices,
              slot_map.slot_indices == nullptr ? 0 : slot_map.num_slot_rows,
              stream, &bytes),
          "MaskedSparseApplyRuleGpuWorkspaceBytes");
      Workspace workspace(bytes, stream);
      const T* hyper = nullptr;
      CheckCuda(WriteGpuRuleHyperparameters(
                    RoundedHyperparameters<T>(checked.hyperparameters),
                    workspace.data(), stream, &hyper),
                "WriteGpuRuleHyperparameters");
      auto run_once = [&] {
        CheckCuda(MaskedSparseApplyRuleGpuAsync<T, Index>(
                      checked.arrays.rule, tables, index_data,
                      checked.problem.num_indices, slot_map,
                      static_cast<const T*>(checked.problem.updates),
                      checked.problem.row_mask, hyper, workspace.data(),
                      workspace.bytes(), stream),
                  "MaskedSparseApplyRuleGpuAsync");
      };
      if (repeats <= 0) {
        run_once();
      } else {
        milliseconds = MeanMilliseconds(stream, warmup, repeats, run_once);
      }
      CheckCuda(
          ReadGpuRuleInputError(workspace.data(), index_data,
                                slot_map.slot_indices, stream, &error, &values),
          "ReadGpuRuleInputError");
    });
  }
  if (!error.ok()) {
    ThrowRuleInputError(checked.problem, error, values,
                        checked.arrays.num_slot_rows);
  }
  return milliseconds;
}

double QuantizedLookupGpuPy(const py::object& codes, const py::object& scales,
                            const py::object& store,
                            const py::object& sorted_ids,
                            const py::object& store_index,
                            const py::object& ids, const py::object& out,
                            const py::object& row_of, uintptr_t stream_handle,
                            int warmup, int repeats) {
  const QuantizedProblem problem = CheckQuantizedProblem(
      ViewCuda(codes, "codes"), ViewCuda(scales, "scales"),
      ViewCuda(store, "store"), ViewCuda(sorted_ids, "sorted_ids"),
      ViewCuda(store_index, "store_index"), ViewCuda(ids, "ids"),
      ViewCuda(out, "out"), ViewCuda(row_of, "row_of"));
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  double milliseconds = 0.0;
  int64_t bad_position = -1;
  int64_t bad_value = 0;
  {
    py::gil_scoped_release release;
    SelectDeviceOf(problem.in.store, "store");
    DispatchIds(problem, [&](auto index_tag) {
      using Index = typename decltype(index_tag)::type;
      const QuantizedLookupInputs<Index> in = TypedInputs<Index>(problem);
      Workspace workspace(kQuantizedLookupGpuWorkspaceBytes, stream);
      auto run_once = [&] {
        CheckCuda(QuantizedLookupGpuAsync(in, problem.out, problem.row_of,
                                          workspace.data(), stream),
                  "QuantizedLookupGpuAsync");
      };
      if (repeats <= 0) {
        run_once();
      } else {
        milliseconds = MeanMilliseconds(stream, warmup, repeats, run_once);
      }
      CheckCuda(
          ReadGpuQuantizedLookupError(workspace.data(), in.ids, in.num_ids,
                                      stream, &bad_position, &bad_value),
          "ReadGpuQuantizedLookupError");
    });
  }
  ThrowIfQuantizedLookupRefused(problem, bad_position, bad_value);
  return milliseconds;
}

bool CudaDeviceAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string DeviceDescription() {
  int device = 0;
  cudaDeviceProp properties;
  CheckCuda(cudaGetDevice(&device), "cudaGetDevice");
  CheckCuda(cudaGetDeviceProperties(&properties, device),
            "cudaGetDeviceProperties");
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return std::string(properties.name) + ", sm_" +
         std::to_string(properties.major) + std::to_string(properties.minor) +
         ", " + std::to_string(properties.multiProcessorCount) + " SMs, " +
         std::to_string(properties.totalGlobalMem >> 20) +
         " MiB; driver CUDA " + std::to_string(driver / 1000) + "." +
         std::to_string(driver % 1000 / 10) + ", runtime CUDA " +
         std::to_string(runtime / 1000) + "." +
         std::to_string(runtime % 1000 / 10);
}

// Device memory for the module's own callers (build_tools/gpu_check.py), so
// the GPU checks need no array library: through the CUDA runtime the module
// links (a GPU's, or the SIMT emulator's).
uintptr_t DeviceAlloc(int64_t bytes) {
  if (bytes < 0) {
    throw py::value_error("bytes: must be >= 0, got " + std::to_string(bytes));
  }
  void* pointer = nullptr;
  CheckCuda(cudaMalloc(&pointer, static_cast<size_t>(bytes)), "cudaMalloc");
  return reinterpret_cast<uintptr_t>(pointer);
}

void DeviceFree(uintptr_t pointer) {
  CheckCuda(cudaFree(reinterpret_cast<void*>(pointer)), "cudaFree");
}

void CopyToDevice(uintptr_t pointer, const py::array& array) {
  if (!(array.flags() & py::array::c_style)) {
    throw py::value_error("array: must be C-contiguous");
  }
  const void* data = array.data();
  const auto bytes = static_cast<size_t>(array.nbytes());
  py::gil_scoped_release release;
  CheckCuda(cudaMemcpy(reinterpret_cast<void*>(pointer), data, bytes,
                       cudaMemcpyHostToDevice),
            "cudaMemcpy to the device");
}

void CopyToHost(py::array& array, uintptr_t pointer) {
  if (!(array.flags() & py::array::c_style) || !array.writeable()) {
    throw py::value_error("array: must be C-contiguous and writable");
  }
  void* data = array.mutable_data();
  const auto bytes = static_cast<size_t>(array.nbytes());
  py::gil_scoped_release release;
  CheckCuda(cudaMemcpy(data, reinterpret_cast<const void*>(pointer), bytes,
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy to the host");
}

#endif  // PE_WITH_CUDA

}  // namespace

// The bag entry points (kernels_bags.cc).
void DefineBagKernels(py::module_& module);

}  // namespace partial_embedding

PYBIND11_MODULE(_kernels, module) {
  namespace py = ::pybind11;
  namespace pe = ::partial_embedding;
  module.doc() =
      "The TF-free MaskedScatterSub, MaskedSparseApplyRule, QuantizedLookup "
      "and EmbeddingBag kernels over NumPy (and, built with CUDA, device) "
      "arrays, for microbenchmarks and GPU tests without TensorFlow.";
  // The GPU rule step sums a row's occurrences in pieces of this many (see
  // cc/core/masked_sparse_apply_gpu.h); a reference model needs it.
  module.attr("RULE_GPU_PIECE_SIZE") = pe::kGpuRulePieceSize;
  // The rule table (cc/core/row_rules.h), in its order: name -> slots,
  // whether each is per row, hyperparameters.
  py::dict rules;
  for (const pe::RuleInfo& info : pe::kRuleTable) {
    py::list slots, per_row, hyperparameters;
    for (int i = 0; i < info.num_slots; ++i) {
      slots.append(info.slot_names[i]);
      per_row.append(info.per_row[i]);
    }
    for (int i = 0; i < info.num_hyperparameters; ++i) {
      hyperparameters.append(info.hyperparameters[i]);
    }
    py::dict entry;
    entry["slots"] = py::tuple(slots);
    entry["per_row"] = py::tuple(per_row);
    entry["hyperparameters"] = py::tuple(hyperparameters);
    rules[info.name] = entry;
  }
  module.attr("RULES") = rules;
  pe::DefineBagKernels(module);
#if PE_WITH_CUDA
  module.attr("HAS_CUDA") = true;
#else
  module.attr("HAS_CUDA") = false;
#endif
  module.def("masked_scatter_sub_cpu", &pe::MaskedScatterSubCpuPy,
             py::arg("var"), py::arg("indices"), py::arg("updates"),
             py::arg("row_mask"), py::kw_only(), py::arg("num_threads") = 0,
             py::arg("dtype") = py::none(),
             R"doc(In place on NumPy arrays: var[i] -= updates[j] for every j
with i = indices[j] and row_mask[i]; duplicates accumulate.

num_threads <= 0 uses every core. dtype="bfloat16" reads uint16 arrays as
bfloat16 bits (ml_dtypes.bfloat16 arrays are recognised without it).
Raises ValueError for bad shapes or dtypes, IndexError naming the first
out-of-range position (nothing is written then).)doc");
  module.def(
      "masked_sparse_apply_rule_cpu", &pe::MaskedSparseApplyRuleCpuPy,
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("indices"),
      py::arg("slot_indices"), py::arg("gradient"), py::arg("row_mask"),
      py::arg("hyperparameters"), py::kw_only(), py::arg("num_threads") = 0,
      py::arg("dtype") = py::none(),
      R"doc(One step of a rule of the table (RULES; cc/core/row_rules.h) in
place on NumPy arrays: the core of MaskedSparseApplyRule (see
cc/core/masked_sparse_apply.h).

slots: the rule's slots in its order (RULES[rule]["slots"]). With
slot_indices None, a per-element slot has var's shape and a per-row slot
[V]. With slot_indices (indices' shape and dtype), they are compact: [S, ...]
or [S], and occurrence k of a permitted row uses slot row slot_indices[k].
hyperparameters: the rule's, in its order (RULES[rule]["hyperparameters"]),
each rounded to var's dtype. Raises IndexError for an index or slot index out
of range and ValueError for an inconsistent slot map (nothing is written
then).)doc");
  module.def("quantized_lookup_cpu", &pe::QuantizedLookupCpuPy,
             py::arg("codes"), py::arg("scales"), py::arg("store"),
             py::arg("sorted_ids"), py::arg("store_index"), py::arg("ids"),
             py::arg("out"), py::arg("row_of"), py::kw_only(),
             py::arg("num_threads") = 0,
             R"doc(The quantized lookup (the core of QuantizedLookup) on NumPy
arrays: out[i] = store[store_index[k]] where ids[i] == sorted_ids[k], else
float(codes[ids[i]]) / scales[ids[i]]; row_of[i] = that store row, or S - 1.

codes int8 [V, D], scales float32 [V], store float32 [S, D], sorted_ids and
store_index int32 [S], ids int32 or int64 [N], out float32 [N, D], row_of
int32 [N]. Raises IndexError for an id out of range and ValueError for a store
index out of range (nothing is written then).)doc");
#if PE_WITH_CUDA
  module.def(
      "masked_sparse_apply_rule_gpu",
      [](const std::string& rule, const py::object& var,
         const std::vector<py::object>& slots, const py::object& indices,
         const py::object& slot_indices, const py::object& gradient,
         const py::object& row_mask, const std::vector<double>& hyperparameters,
         uintptr_t stream, const std::optional<std::string>& dtype) {
        pe::RunRuleGpu(rule, var, slots, indices, slot_indices, gradient,
                       row_mask, hyperparameters, stream, dtype, 0, 0);
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("indices"),
      py::arg("slot_indices"), py::arg("gradient"), py::arg("row_mask"),
      py::arg("hyperparameters"), py::kw_only(), py::arg("stream") = 0,
      py::arg("dtype") = py::none(),
      R"doc(The rule's step on device arrays (__cuda_array_interface__), with
masked_sparse_apply_rule_cpu's arguments and errors. Runs on `stream` and
waits for it. A row's occurrences are summed in pieces of RULE_GPU_PIECE_SIZE
(see cc/core/masked_sparse_apply_gpu.h): rows with at most that many get the
CPU kernel's bits (the row-wise rules: up to the rounding of the row's sum of
squares).)doc");
  module.def(
      "time_masked_sparse_apply_rule_gpu",
      [](const std::string& rule, const py::object& var,
         const std::vector<py::object>& slots, const py::object& indices,
         const py::object& slot_indices, const py::object& gradient,
         const py::object& row_mask, const std::vector<double>& hyperparameters,
         int warmup, int repeats, uintptr_t stream,
         const std::optional<std::string>& dtype) {
        if (repeats <= 0) throw py::value_error("repeats: must be positive");
        return pe::RunRuleGpu(rule, var, slots, indices, slot_indices, gradient,
                              row_mask, hyperparameters, stream, dtype, warmup,
                              repeats);
      },
      py::arg("rule"), py::arg("var"), py::arg("slots"), py::arg("indices"),
      py::arg("slot_indices"), py::arg("gradient"), py::arg("row_mask"),
      py::arg("hyperparameters"), py::kw_only(), py::arg("warmup") = 2,
      py::arg("repeats") = 10, py::arg("stream") = 0,
      py::arg("dtype") = py::none(),
      "Applies the step warmup + repeats times (the tables keep changing) and "
      "returns the mean milliseconds per step, timed with CUDA events.");
  module.def(
      "quantized_lookup_gpu",
      [](const py::object& codes, const py::object& scales,
         const py::object& store, const py::object& sorted_ids,
         const py::object& store_index, const py::object& ids,
         const py::object& out, const py::object& row_of, uintptr_t stream,
         int warmup, int repeats) {
        return pe::QuantizedLookupGpuPy(codes, scales, store, sorted_ids,
                                        store_index, ids, out, row_of, stream,
                                        warmup, repeats);
      },
      py::arg("codes"), py::arg("scales"), py::arg("store"),
      py::arg("sorted_ids"), py::arg("store_index"), py::arg("ids"),
      py::arg("out"), py::arg("row_of"), py::kw_only(), py::arg("stream") = 0,
      py::arg("warmup") = 0, py::arg("repeats") = 0,
      "quantized_lookup_cpu on device arrays; with repeats > 0, runs it "
      "warmup + repeats times and returns the mean milliseconds per call.");
  module.def(
      "masked_scatter_sub_gpu",
      [](const py::object& var, const py::object& indices,
         const py::object& updates, const py::object& row_mask,
         bool deterministic, uintptr_t stream,
         const std::optional<std::string>& dtype) {
        pe::RunGpu(var, indices, updates, row_mask, deterministic, stream,
                   dtype, 0, 0);
      },
      py::arg("var"), py::arg("indices"), py::arg("updates"),
      py::arg("row_mask"), py::kw_only(), py::arg("deterministic") = false,
      py::arg("stream") = 0, py::arg("dtype") = py::none(),
      R"doc(The same update on device arrays (__cuda_array_interface__).

Runs on `stream` (a cudaStream_t as an int; 0 is the legacy default stream,
which CuPy and PyTorch use by default) and waits for it. deterministic=True
never uses float atomics: bit-identical results from run to run.)doc");
  module.def(
      "time_masked_scatter_sub_gpu",
      [](const py::object& var, const py::object& indices,
         const py::object& updates, const py::object& row_mask,
         bool deterministic, int warmup, int repeats, uintptr_t stream,
         const std::optional<std::string>& dtype) {
        if (repeats <= 0) throw py::value_error("repeats: must be positive");
        return pe::RunGpu(var, indices, updates, row_mask, deterministic,
                          stream, dtype, warmup, repeats);
      },
      py::arg("var"), py::arg("indices"), py::arg("updates"),
      py::arg("row_mask"), py::kw_only(), py::arg("deterministic") = false,
      py::arg("warmup") = 2, py::arg("repeats") = 10, py::arg("stream") = 0,
      py::arg("dtype") = py::none(),
      "Applies the update warmup + repeats times (var keeps changing) and "
      "returns the mean milliseconds per call, timed with CUDA events.");
  module.def("time_device_copy_gpu", &pe::TimeDeviceCopy, py::arg("dst"),
             py::arg("src"), py::kw_only(), py::arg("warmup") = 2,
             py::arg("repeats") = 10, py::arg("stream") = 0,
             "Mean milliseconds of a device-to-device copy of src into dst.");
  module.def("cuda_device_available", &pe::CudaDeviceAvailable,
             "Whether the CUDA runtime sees a GPU.");
  module.def("cuda_device_description", &pe::DeviceDescription,
             "Name, compute capability, memory, driver and runtime of the "
             "current GPU.");
  module.def("device_alloc", &pe::DeviceAlloc, py::arg("bytes"),
             "cudaMalloc: the address of `bytes` bytes of device memory.");
  module.def("device_free", &pe::DeviceFree, py::arg("pointer"),
             "cudaFree of an address device_alloc returned.");
  module.def("copy_to_device", &pe::CopyToDevice, py::arg("pointer"),
             py::arg("array"),
             "Copies a C-contiguous NumPy array to device memory and waits.");
  module.def("copy_to_host", &pe::CopyToHost, py::arg("array"),
             py::arg("pointer"),
             "Copies device memory into a C-contiguous NumPy array and waits.");
#if PE_SIMT
  module.def("simt_seed", &pe_simt::Seed,
             "The SIMT emulator's scheduling seed (PE_SIMT_SEED).");
  module.def("simt_set_seed", &pe_simt::SetSeed, py::arg("seed"),
             "Draws the emulator's schedules from `seed` from now on.");
  module.def(
      "simt_launch_counts",
      [] {
        std::map<std::string, int64_t> counts;
        for (const auto& [name, count] : pe_simt::LaunchCounts()) {
          counts[name] += count;
        }
        return counts;
      },
      "Launches run so far, per kernel name.");
  module.def("simt_reset_launch_counts", &pe_simt::ResetLaunchCounts,
             "Sets every kernel's launch count back to 0.");
  module.def("simt_fault_count", &pe_simt::FaultCount,
             "How many faults (broken collectives, deadlocks, ...) the "
             "emulator reported.");
#endif  // PE_SIMT
#else
  module.def(
      "cuda_device_available", [] { return false; },
      "Whether the CUDA runtime sees a GPU (never: built without CUDA).");
#endif  // PE_WITH_CUDA
  // Whether the CUDA entry points run on the SIMT emulator (cc/simt/).
  module.attr("SIMT") = static_cast<bool>(PE_SIMT);
}
