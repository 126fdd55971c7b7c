// The bag entry points of partial_embedding._kernels: EmbeddingBag and its
// gradient over NumPy arrays, and the gradient over CUDA arrays, for tests of
// the TF-free core where TensorFlow is absent (build_tools/gpu_check.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cc/core/embedding_bag.h"
#include "cc/core/embedding_bag_contract.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_contract.h"
#include "cc/python/arrays.h"
#if PE_WITH_CUDA
#include "cc/core/embedding_bag_apply_gpu.h"
#include "cc/core/embedding_bag_gpu.h"
#include "cc/core/masked_sparse_apply_gpu.h"
#endif

namespace partial_embedding {
namespace {

// The most slot rows a float32 map holds exactly (MaskedOptimizer's
// MAX_SLOT_ROWS).
constexpr int64_t kMaxCompactSlotRows = int64_t{1} << 24;

// The checked positions of one call: ids, bags and a per-position vector of
// the compute type (weights or factors; may be absent for weights).
struct BagCall {
  ValueType value_type = ValueType::kFloat32;
  IndexType index_type = IndexType::kInt32;
  int64_t num_positions = 0;
  std::vector<int64_t> row_shape;  // The table's or grad's shape after dim 0.
  int64_t row_size = 1;
  const void* ids = nullptr;
  const void* bags = nullptr;

  // The positions as the core takes them, for `num_bags` bags of a table of
  // `num_rows` rows.
  template <typename Index>
  BagPositions<Index> Positions(int64_t num_bags, int64_t num_rows) const {
    BagPositions<Index> positions;
    positions.ids = static_cast<const Index*>(ids);
    positions.bags = static_cast<const int64_t*>(bags);
    positions.num_positions = num_positions;
    positions.num_bags = num_bags;
    positions.num_rows = num_rows;
    return positions;
  }
};

// Checks what only the arrays show, once the bag contract of
// cc/core/embedding_bag_contract.h has passed their shapes: a table-like
// array (params or grad) of a value dtype, int32/int64 ids, int64 bags and a
// per-position vector of the compute type.
BagCall CheckBagCall(const ArrayView& table, const char* table_name,
                     const ArrayView& ids, const ArrayView& bags,
                     const ArrayView* per_position, const char* per_name,
                     const std::optional<std::string>& dtype) {
  BagCall call;
  call.value_type = ResolveValueType(table, table_name, dtype);
  call.row_shape.assign(table.shape.begin() + 1, table.shape.end());
  for (const int64_t dim : call.row_shape) call.row_size *= dim;
  if (ids.kind != 'i' || (ids.itemsize != 4 && ids.itemsize != 8)) {
    throw py::value_error("ids: dtype " + ids.dtype_name +
                          " is not int32 or int64");
  }
  call.index_type = ids.itemsize == 4 ? IndexType::kInt32 : IndexType::kInt64;
  if (bags.kind != 'i' || bags.itemsize != 8) {
    throw py::value_error("bags: dtype " + bags.dtype_name + " is not int64");
  }
  call.num_positions = ids.shape[0];
  call.ids = ids.data;
  call.bags = bags.data;
  if (per_position != nullptr) {
    const bool is_double = call.value_type == ValueType::kFloat64;
    if (per_position->kind != 'f' ||
        per_position->itemsize != (is_double ? 8 : 4)) {
      throw py::value_error(std::string(per_name) + ": dtype " +
                            per_position->dtype_name + " must be " +
                            (is_double ? "float64" : "float32") +
                            " (the compute type of " + table.dtype_name + ")");
    }
  }
  return call;
}

// Checks that row_mask holds bools (its shape is the contract's).
void CheckRowMaskDtype(const ArrayView& row_mask) {
  if (row_mask.kind != 'b') {
    throw py::value_error("row_mask: dtype " + row_mask.dtype_name +
                          " is not bool");
  }
}

// Checks that `table` (var or a slot), written in place, is writable and of
// grad's dtype (`dtype`: the call's dtype= argument, for bfloat16 bits).
void CheckWritableTable(const ArrayView& table, const char* name,
                        const ArrayView& grad, const BagCall& call,
                        const std::optional<std::string>& dtype = {}) {
  if (ResolveValueType(table, name, dtype) != call.value_type ||
      table.itemsize != grad.itemsize) {
    throw py::value_error(std::string(name) + ": dtype " + table.dtype_name +
                          " does not match grad's dtype " + grad.dtype_name);
  }
  if (!table.writable) {
    throw py::value_error(std::string(name) + ": must be writable");
  }
}

// Checks the arrays of one gradient: their shapes by the bag contract, then
// their dtypes.
BagCall CheckGradCall(const ArrayView& grad, const ArrayView& ids,
                      const ArrayView& bags, const ArrayView& factors,
                      const ArrayView& row_mask,
                      const std::optional<std::string>& dtype) {
  ThrowIfError(
      CheckBagGradShapes({grad.shape,
                          {ids.shape, bags.shape, factors.shape, "factors"},
                          row_mask.shape},
                         ShapeNotation::kNumPy));
  const BagCall call =
      CheckBagCall(grad, "grad", ids, bags, &factors, "factors", dtype);
  CheckRowMaskDtype(row_mask);
  return call;
}

[[noreturn]] void ThrowBagError(const BagInputError& error, int64_t num_rows,
                                int64_t num_bags) {
  const std::string message = BagInputErrorMessage(error, num_rows, num_bags);
  if (error.kind == BagInputError::Kind::kIdOutOfRange) {
    throw py::index_error(message);
  }
  throw py::value_error(message);
}

// A NumPy array of `shape` with `like`'s dtype.
py::array EmptyLike(const py::array& like, const std::vector<int64_t>& shape) {
  return py::array(like.dtype(),
                   std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

py::array ComputeArray(ValueType value_type, int64_t size) {
  if (value_type == ValueType::kFloat64) return py::array_t<double>(size);
  return py::array_t<float>(size);
}

std::tuple<py::array, py::array> EmbeddingBagCpuPy(
    const py::array& params, const py::array& ids, const py::array& bags,
    int64_t num_bags, const std::optional<py::array>& weights,
    const std::string& combiner, int num_threads,
    const std::optional<std::string>& dtype) {
  const ArrayView params_view = ViewNumpy(params, "params");
  const ArrayView ids_view = ViewNumpy(ids, "ids");
  const ArrayView bags_view = ViewNumpy(bags, "bags");
  std::optional<ArrayView> weights_view;
  if (weights.has_value()) weights_view = ViewNumpy(*weights, "weights");
  const ArrayView* weights_ptr = weights_view ? &*weights_view : nullptr;
  std::optional<Dims> weights_shape;
  if (weights_ptr != nullptr) weights_shape = weights_ptr->shape;
  ThrowIfError(CheckBagLookupShapes(
      {params_view.shape,
       {ids_view.shape, bags_view.shape, weights_shape, "weights"},
       {},
       num_bags},
      ShapeNotation::kNumPy));
  const BagCall call = CheckBagCall(params_view, "params", ids_view, bags_view,
                                    weights_ptr, "weights", dtype);
  BagCombiner mode = BagCombiner::kMean;
  if (combiner == "sum") {
    mode = BagCombiner::kSum;
  } else if (combiner == "sqrtn") {
    mode = BagCombiner::kSqrtN;
  } else if (combiner != "mean") {
    throw py::value_error("combiner: \"" + combiner +
                          "\" is not sum, mean or sqrtn");
  }
  std::vector<int64_t> out_shape{num_bags};
  out_shape.insert(out_shape.end(), call.row_shape.begin(),
                   call.row_shape.end());
  py::array out = EmptyLike(params, out_shape);
  py::array factors = ComputeArray(call.value_type, call.num_positions);
  BagInputError error;
  {
    py::gil_scoped_release release;
    DispatchTypes(
        call.value_type, call.index_type, [&](auto value_tag, auto index_tag) {
          using T = typename decltype(value_tag)::type;
          using Index = typename decltype(index_tag)::type;
          using C = typename Arith<T>::Compute;
          const BagPositions<Index> positions =
              call.Positions<Index>(num_bags, params_view.shape[0]);
          error = EmbeddingBagCpu<T, Index>(
              static_cast<const T*>(params.data()), call.row_size, positions,
              weights_view ? static_cast<const C*>(weights_view->data)
                           : nullptr,
              mode, static_cast<T*>(out.mutable_data()),
              static_cast<C*>(factors.mutable_data()),
              PlainThreads(Threads(num_threads)));
        });
  }
  if (!error.ok()) ThrowBagError(error, params_view.shape[0], num_bags);
  return {out, factors};
}

std::tuple<py::array, py::array> MaskedEmbeddingBagGradCpuPy(
    const py::array& grad, const py::array& ids, const py::array& bags,
    const py::array& factors, const py::array& row_mask, int num_threads,
    const std::optional<std::string>& dtype) {
  const ArrayView grad_view = ViewNumpy(grad, "grad");
  const ArrayView mask_view = ViewNumpy(row_mask, "row_mask");
  const BagCall call =
      CheckGradCall(grad_view, ViewNumpy(ids, "ids"), ViewNumpy(bags, "bags"),
                    ViewNumpy(factors, "factors"), mask_view, dtype);
  const int64_t num_rows = mask_view.shape[0];
  const int64_t num_bags = grad_view.shape[0];
  RowGroups groups;
  BagInputError error;
  py::array rows;
  py::array values;
  DispatchTypes(
      call.value_type, call.index_type, [&](auto value_tag, auto index_tag) {
        using T = typename decltype(value_tag)::type;
        using Index = typename decltype(index_tag)::type;
        using C = typename Arith<T>::Compute;
        const BagPositions<Index> positions =
            call.Positions<Index>(num_bags, num_rows);
        {
          py::gil_scoped_release release;
          error = PlanEmbeddingBagGrad(
              positions, static_cast<const bool*>(mask_view.data), &groups);
        }
        if (!error.ok()) return;
        const int64_t num_groups = groups.num_groups();
        rows = py::array_t<Index>(num_groups);
        auto* row_data = static_cast<Index*>(rows.mutable_data());
        for (int64_t g = 0; g < num_groups; ++g) {
          row_data[g] = static_cast<Index>(groups.rows[g]);
        }
        std::vector<int64_t> values_shape{num_groups};
        values_shape.insert(values_shape.end(), call.row_shape.begin(),
                            call.row_shape.end());
        values = EmptyLike(grad, values_shape);
        py::gil_scoped_release release;
        EmbeddingBagGradValuesCpu<T>(
            static_cast<const T*>(grad.data()), call.row_size, positions.bags,
            static_cast<const C*>(factors.data()), groups,
            static_cast<T*>(values.mutable_data()),
            PlainThreads(Threads(num_threads)));
      });
  if (!error.ok()) ThrowBagError(error, num_rows, num_bags);
  return {rows, values};
}

// The checked arrays of one fused bag backward + rule step, any rule of the
// table (row_rules.h), full-size slots: var and the rule's slots (written in
// place), the bags' gradient, the positions, row_mask and the rule's
// hyperparameters as Python gives them.
struct BagRuleCall {
  BagCall call;
  Rule rule = Rule::kSgd;
  int64_t num_rows = 0;
  int64_t num_bags = 0;
  void* var = nullptr;
  void* slots[kMaxSlots] = {};
  const void* grad = nullptr;
  const void* factors = nullptr;
  const bool* row_mask = nullptr;
  std::vector<double> hyperparameters;
  // Compact slots: the map (float32 [V], written in place) and the slots'
  // rows; null and 0 for full-size slots.
  float* slot_of_row = nullptr;
  int64_t num_slot_rows = 0;

  template <typename T>
  RuleTables<T> Tables() const {
    RuleTables<T> tables;
    tables.var = static_cast<T*>(var);
    for (int i = 0; i < kMaxSlots; ++i)
      tables.slots[i] = static_cast<T*>(slots[i]);
    tables.num_rows = num_rows;
    tables.row_size = call.row_size;
    return tables;
  }

  // Calls f(Tag<T>, Tag<Index>, positions) with the step's types and its
  // positions as the core takes them.
  template <typename F>
  void Dispatch(F&& f) const {
    DispatchTypes(
        call.value_type, call.index_type, [&](auto value_tag, auto index_tag) {
          using Index = typename decltype(index_tag)::type;
          f(value_tag, index_tag, call.Positions<Index>(num_bags, num_rows));
        });
  }
};

// Checks one fused step's arrays: the rule and its slot count, the bag
// contract's shapes (cc/core/embedding_bag_contract.h), then the dtypes.
BagRuleCall CheckBagRuleCall(const std::string& rule_name, const ArrayView& var,
                             const std::vector<ArrayView>& slots,
                             const ArrayView& grad, const ArrayView& ids,
                             const ArrayView& bags, const ArrayView& factors,
                             const ArrayView& row_mask,
                             const std::optional<ArrayView>& slot_of_row,
                             const std::vector<double>& hyperparameters,
                             const std::optional<std::string>& dtype) {
  BagRuleCall checked;
  ThrowIfError(RuleOfAttrs(rule_name, static_cast<int64_t>(slots.size()),
                           &checked.rule));
  const RuleInfo& info = InfoOf(checked.rule);
  BagAdamShapes shapes;
  shapes.var = var.shape;
  for (int i = 0; i < info.num_slots; ++i) {
    shapes.slots.push_back(
        {info.slot_names[i], slots[i].shape, info.per_row[i]});
  }
  shapes.grad = grad.shape;
  shapes.positions = {ids.shape, bags.shape, factors.shape, "factors"};
  shapes.row_mask = row_mask.shape;
  if (slot_of_row.has_value()) shapes.slot_of_row = slot_of_row->shape;
  ThrowIfError(CheckBagAdamShapes(shapes, ShapeNotation::kNumPy));
  ThrowIfError(CheckHyperparametersShape(
      checked.rule, {static_cast<int64_t>(hyperparameters.size())},
      ShapeNotation::kNumPy));
  checked.call =
      CheckBagCall(grad, "grad", ids, bags, &factors, "factors", dtype);
  CheckWritableTable(var, "var", grad, checked.call, dtype);
  for (int i = 0; i < info.num_slots; ++i) {
    CheckWritableTable(slots[i], info.slot_names[i], grad, checked.call, dtype);
    checked.slots[i] = slots[i].data;
  }
  CheckRowMaskDtype(row_mask);
  checked.num_rows = var.shape[0];
  checked.num_bags = grad.shape[0];
  checked.var = var.data;
  checked.grad = grad.data;
  checked.factors = factors.data;
  checked.row_mask = static_cast<const bool*>(row_mask.data);
  checked.hyperparameters = hyperparameters;
  if (slot_of_row.has_value()) {
    if (slot_of_row->kind != 'f' || slot_of_row->itemsize != 4 ||
        !slot_of_row->writable) {
      throw py::value_error("slot_of_row: must be writable float32, got " +
                            slot_of_row->dtype_name);
    }
    checked.slot_of_row = static_cast<float*>(slot_of_row->data);
    // Without slots (plain SGD) the map's slot rows are only counted.
    checked.num_slot_rows =
        info.num_slots > 0 ? slots[0].shape[0] : kMaxCompactSlotRows;
  }
  return checked;
}

// The message of a slot map that refused the step (the TensorFlow kernel's
// words), or of a step needing more slot rows than the arrays have: the
// module writes in place and does not grow them.
[[noreturn]] void ThrowSlotMapError(const SlotMapPlan& plan,
                                    int64_t num_slot_rows) {
  using Kind = SlotMapPlan::Kind;
  switch (plan.kind) {
    case Kind::kNotASlotRow:
      throw py::value_error("slot_of_row[" + std::to_string(plan.row) +
                            "] = " + std::to_string(plan.map_value) +
                            " is not a slot row (a whole number in [0, " +
                            std::to_string(num_slot_rows) +
                            "), or negative for none); nothing was written");
    case Kind::kSlotRowOfTwoRows:
      throw py::value_error(
          "slot_of_row: rows " + std::to_string(plan.other_row) + " and " +
          std::to_string(plan.row) + " both have slot row " +
          std::to_string(plan.slot_row) + "; nothing was written");
    case Kind::kTooManySlotRows:
      throw py::value_error("rows_used: " + std::to_string(plan.needed) +
                            " slot rows is not in [0, " +
                            std::to_string(kMaxCompactSlotRows) +
                            "]; nothing was written");
    case Kind::kNone:
      break;
  }
  throw py::value_error(
      "slots: the step needs " + std::to_string(plan.rows_used_after) +
      " slot rows, the arrays have " + std::to_string(num_slot_rows) +
      " (the module does not grow them); nothing was "
      "written");
}

// CheckBagRuleCall on Python's arrays: NumPy ones (view: ViewNumpy) or
// device ones (ViewCuda).
template <typename Array, typename View>
BagRuleCall CheckBagRuleArrays(View view, const std::string& rule,
                               const Array& var,
                               const std::vector<Array>& slots,
                               const Array& grad, const Array& ids,
                               const Array& bags, const Array& factors,
                               const Array& row_mask,
                               const std::vector<double>& hyperparameters,
                               const std::optional<Array>& slot_of_row,
                               const std::optional<std::string>& dtype) {
  std::optional<ArrayView> map;
  if (slot_of_row.has_value()) map = view(*slot_of_row, "slot_of_row");
  return CheckBagRuleCall(
      rule, view(var, "var"), ViewSlots(slots, view), view(grad, "grad"),
      view(ids, "ids"), view(bags, "bags"), view(factors, "factors"),
      view(row_mask, "row_mask"), map, hyperparameters, dtype);
}

// Whether compact slots' plan lets the step write: the map refused nothing
// and the arrays hold the slot rows it needs.
bool SlotPlanFits(const SlotMapPlan& plan, int64_t num_slot_rows) {
  return plan.ok() && plan.rows_used_after <= num_slot_rows;
}

// Raises what a fused step refused (a bad position; with compact slots, the
// map's refusal or too few slot rows), else returns the slot rows in use
// after it.
int64_t BagRuleStepResult(const BagRuleCall& checked,
                          const BagInputError& error,
                          const SlotMapPlan& slot_plan) {
  if (!error.ok()) ThrowBagError(error, checked.num_rows, checked.num_bags);
  if (checked.slot_of_row != nullptr &&
      !SlotPlanFits(slot_plan, checked.num_slot_rows)) {
    ThrowSlotMapError(slot_plan, checked.num_slot_rows);
  }
  return slot_plan.rows_used_after;
}

// The fused step on the CPU (the CPU kernel of MaskedEmbeddingBagApplyRule:
// PlanEmbeddingBagGrad, then ApplyPlannedBagRuleCpu), in place on NumPy
// arrays: the reference the GPU step is checked against.
int64_t MaskedEmbeddingBagApplyRuleCpuPy(
    const std::string& rule, const py::array& var,
    const std::vector<py::array>& slots, const py::array& grad,
    const py::array& ids, const py::array& bags, const py::array& factors,
    const py::array& row_mask, const std::vector<double>& hyperparameters,
    const std::optional<py::array>& slot_of_row, int64_t rows_used,
    int num_threads, const std::optional<std::string>& dtype) {
  const BagRuleCall checked =
      CheckBagRuleArrays(ViewNumpy, rule, var, slots, grad, ids, bags, factors,
                         row_mask, hyperparameters, slot_of_row, dtype);
  const bool compact = checked.slot_of_row != nullptr;
  BagInputError error;
  SlotMapPlan slot_plan;
  slot_plan.rows_used_after = rows_used;
  {
    py::gil_scoped_release release;
    checked.Dispatch([&](auto value_tag, auto, const auto& positions) {
      using T = typename decltype(value_tag)::type;
      using C = typename Arith<T>::Compute;
      RowGroups groups;
      error = PlanEmbeddingBagGrad(positions, checked.row_mask, &groups);
      if (!error.ok()) return;
      if (compact) {
        // As the TensorFlow kernel: slot rows from the map, new ones in
        // order of first occurrence, the map written before the step.
        slot_plan = PlanSlotRowsFromMap(checked.slot_of_row, rows_used,
                                        checked.num_slot_rows,
                                        kMaxCompactSlotRows, &groups);
        if (!SlotPlanFits(slot_plan, checked.num_slot_rows)) return;
        for (const int64_t g : slot_plan.new_groups) {
          checked.slot_of_row[groups.rows[g]] =
              static_cast<float>(groups.slot_rows[g]);
        }
      }
      ApplyPlannedBagRuleCpu<T>(
          checked.rule, checked.Tables<T>(), groups,
          static_cast<const T*>(checked.grad), positions.bags,
          static_cast<const C*>(checked.factors),
          RoundedHyperparameters<T>(checked.hyperparameters),
          PlainThreads(Threads(num_threads)));
    });
  }
  return BagRuleStepResult(checked, error, slot_plan);
}

#if PE_WITH_CUDA

// The gradient on device arrays into caller-allocated rows ([N] at least)
// and values ([N] + row shape at least); returns how many rows it filled.
// With repeats > 0, runs warmup + repeats times and also returns the mean
// milliseconds of a timed call (plan and values together).
std::tuple<int64_t, double> MaskedEmbeddingBagGradGpuPy(
    const py::object& grad, const py::object& ids, const py::object& bags,
    const py::object& factors, const py::object& row_mask,
    const py::object& rows, const py::object& values, uintptr_t stream_handle,
    const std::optional<std::string>& dtype, int warmup, int repeats) {
  const ArrayView grad_view = ViewCuda(grad, "grad");
  const ArrayView factors_view = ViewCuda(factors, "factors");
  const ArrayView ids_view = ViewCuda(ids, "ids");
  const ArrayView bags_view = ViewCuda(bags, "bags");
  const ArrayView mask_view = ViewCuda(row_mask, "row_mask");
  const ArrayView rows_view = ViewCuda(rows, "rows");
  const ArrayView values_view = ViewCuda(values, "values");
  const BagCall call = CheckGradCall(grad_view, ids_view, bags_view,
                                     factors_view, mask_view, dtype);
  if (rows_view.kind != ids_view.kind ||
      rows_view.itemsize != ids_view.itemsize || rows_view.shape.size() != 1 ||
      rows_view.shape[0] < call.num_positions) {
    throw py::value_error(
        "rows: must be a vector of ids' dtype with at least " +
        std::to_string(call.num_positions) + " entries");
  }
  int64_t values_rows_capacity =
      values_view.shape.empty() ? 0 : values_view.shape[0];
  if (values_view.itemsize != grad_view.itemsize ||
      values_view.shape.size() != grad_view.shape.size() ||
      values_rows_capacity < call.num_positions ||
      !std::equal(values_view.shape.begin() + 1, values_view.shape.end(),
                  grad_view.shape.begin() + 1) ||
      !values_view.writable || !rows_view.writable) {
    throw py::value_error(
        "values: must be writable, of grad's dtype and row shape, with at "
        "least as many rows as ids");
  }
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const int64_t num_rows = mask_view.shape[0];
  const int64_t num_bags = grad_view.shape[0];
  int64_t num_groups = 0;
  double milliseconds = 0.0;
  BagInputError error;
  {
    py::gil_scoped_release release;
    if (call.num_positions > 0) SelectDeviceOf(ids_view.data, "ids");
    DispatchTypes(
        call.value_type, call.index_type, [&](auto value_tag, auto index_tag) {
          using T = typename decltype(value_tag)::type;
          using Index = typename decltype(index_tag)::type;
          using C = typename Arith<T>::Compute;
          const BagPositions<Index> positions =
              call.Positions<Index>(num_bags, num_rows);
          size_t bytes = 0;
          CheckCuda(EmbeddingBagGradGpuWorkspaceBytes(
                        num_rows, call.num_positions, stream, &bytes),
                    "EmbeddingBagGradGpuWorkspaceBytes");
          Workspace workspace(bytes, stream);
          auto run_once = [&] {
            CheckCuda(EmbeddingBagGradGpuPlan(
                          positions, static_cast<const bool*>(mask_view.data),
                          workspace.data(), workspace.bytes(), stream,
                          &num_groups, &error),
                      "EmbeddingBagGradGpuPlan");
            if (!error.ok()) return;
            CheckCuda(EmbeddingBagGradGpuValues(
                          static_cast<const T*>(grad_view.data), call.row_size,
                          positions, static_cast<const C*>(factors_view.data),
                          num_groups, workspace.data(), workspace.bytes(),
                          static_cast<Index*>(rows_view.data),
                          static_cast<T*>(values_view.data), stream),
                      "EmbeddingBagGradGpuValues");
          };
          if (repeats <= 0) {
            run_once();
          } else {
            milliseconds = MeanMilliseconds(stream, warmup, repeats, run_once);
          }
          CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        });
  }
  if (!error.ok()) ThrowBagError(error, num_rows, num_bags);
  return {num_groups, milliseconds};
}

// The fused step on device arrays (EmbeddingBagGradGpuPlan, then
// EmbeddingBagApplyRuleGpuAsync), in place; waits for `stream`.
int64_t MaskedEmbeddingBagApplyRuleGpuPy(
    const std::string& rule, const py::object& var,
    const std::vector<py::object>& slots, const py::object& grad,
    const py::object& ids, const py::object& bags, const py::object& factors,
    const py::object& row_mask, const std::vector<double>& hyperparameters,
    const std::optional<py::object>& slot_of_row, int64_t rows_used,
    uintptr_t stream_handle, const std::optional<std::string>& dtype) {
  const BagRuleCall checked =
      CheckBagRuleArrays(ViewCuda, rule, var, slots, grad, ids, bags, factors,
                         row_mask, hyperparameters, slot_of_row, dtype);
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const bool compact = checked.slot_of_row != nullptr;
  BagInputError error;
  SlotMapPlan slot_plan;
  slot_plan.rows_used_after = rows_used;
  {
    py::gil_scoped_release release;
    if (checked.num_rows > 0) SelectDeviceOf(checked.var, "var");
    checked.Dispatch([&](auto value_tag, auto index_tag,
                         const auto& positions) {
      using T = typename decltype(value_tag)::type;
      using Index = typename decltype(index_tag)::type;
      using C = typename Arith<T>::Compute;
      size_t plan_bytes = 0;
      CheckCuda(
          EmbeddingBagGradGpuWorkspaceBytes(
              checked.num_rows, positions.num_positions, stream, &plan_bytes),
          "EmbeddingBagGradGpuWorkspaceBytes");
      Workspace plan(plan_bytes, stream);
      int64_t num_groups = 0;
      CheckCuda(
          EmbeddingBagGradGpuPlan(positions, checked.row_mask, plan.data(),
                                  plan.bytes(), stream, &num_groups, &error),
          "EmbeddingBagGradGpuPlan");
      if (!error.ok()) return;
      std::optional<Workspace> slot_workspace;
      BagSlotRows slot_rows;
      if (compact) {
        size_t slot_bytes = 0;
        CheckCuda(
            EmbeddingBagSlotRowsGpuWorkspaceBytes<Index>(
                positions.num_positions, num_groups, checked.num_slot_rows,
                std::clamp<int64_t>(rows_used, 0, kMaxCompactSlotRows), stream,
                &slot_bytes),
            "EmbeddingBagSlotRowsGpuWorkspaceBytes");
        slot_workspace.emplace(slot_bytes, stream);
        CheckCuda(EmbeddingBagSlotRowsGpuPlan<Index>(
                      positions, checked.slot_of_row, rows_used,
                      checked.num_slot_rows, kMaxCompactSlotRows, num_groups,
                      plan.data(), plan.bytes(), slot_workspace->data(),
                      slot_workspace->bytes(), stream, &slot_plan),
                  "EmbeddingBagSlotRowsGpuPlan");
        if (!SlotPlanFits(slot_plan, checked.num_slot_rows)) return;
        // A rule without slots steps var alone: nothing to map.
        if (InfoOf(checked.rule).num_slots > 0) {
          slot_rows = {slot_workspace->data(), slot_workspace->bytes(),
                       checked.num_slot_rows};
        }
      }
      if (num_groups > 0 && checked.call.row_size > 0) {
        size_t step_bytes = 0;
        CheckCuda(EmbeddingBagApplyRuleGpuWorkspaceBytes<T, Index>(
                      checked.num_rows, checked.call.row_size, num_groups,
                      slot_rows.num_slot_rows, stream, &step_bytes),
                  "EmbeddingBagApplyRuleGpuWorkspaceBytes");
        Workspace step(step_bytes, stream);
        const T* hyper = nullptr;
        CheckCuda(WriteGpuRuleHyperparameters<T>(
                      RoundedHyperparameters<T>(checked.hyperparameters),
                      step.data(), stream, &hyper),
                  "WriteGpuRuleHyperparameters");
        CheckCuda(EmbeddingBagApplyRuleGpuAsync<T, Index>(
                      checked.rule, checked.Tables<T>(),
                      static_cast<const T*>(checked.grad), positions,
                      static_cast<const C*>(checked.factors), checked.row_mask,
                      hyper, num_groups, plan.data(), plan.bytes(), step.data(),
                      step.bytes(), stream, slot_rows),
                  "EmbeddingBagApplyRuleGpuAsync");
        CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      }
      if (compact) {
        // The module keeps the count on the host: a scratch int64 takes
        // the core's device write.
        Workspace count(sizeof(int64_t), stream);
        CheckCuda(EmbeddingBagWriteSlotMapGpu<Index>(
                      positions.num_positions, num_groups,
                      slot_plan.rows_used_after, slot_workspace->data(),
                      slot_workspace->bytes(), checked.slot_of_row,
                      static_cast<int64_t*>(count.data()), stream),
                  "EmbeddingBagWriteSlotMapGpu");
        CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      }
    });
  }
  return BagRuleStepResult(checked, error, slot_plan);
}

// GrowSlotGpu on device arrays: grown's first old.size elements from old,
// the rest `initial` (rounded to the dtype); waits for `stream`.
void GrowSlotGpuPy(const py::object& old, const py::object& grown,
                   double initial, uintptr_t stream_handle,
                   const std::optional<std::string>& dtype) {
  const ArrayView old_view = ViewCuda(old, "old");
  const ArrayView grown_view = ViewCuda(grown, "grown");
  const ValueType value_type = ResolveValueType(old_view, "old", dtype);
  if (ResolveValueType(grown_view, "grown", dtype) != value_type ||
      !grown_view.writable) {
    throw py::value_error("grown: must be writable and of old's dtype");
  }
  const auto count = [](const ArrayView& view) {
    int64_t elements = 1;
    for (const int64_t dim : view.shape) elements *= dim;
    return elements;
  };
  const int64_t old_count = count(old_view);
  const int64_t new_count = count(grown_view);
  if (new_count < old_count) {
    throw py::value_error("grown: fewer elements than old");
  }
  const auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  py::gil_scoped_release release;
  if (new_count > 0) SelectDeviceOf(grown_view.data, "grown");
  DispatchTypes(value_type, IndexType::kInt32, [&](auto value_tag, auto) {
    using T = typename decltype(value_tag)::type;
    const T value =
        Arith<T>::Store(static_cast<typename Arith<T>::Compute>(initial));
    CheckCuda(GrowSlotGpu<T>(static_cast<const T*>(old_view.data), old_count,
                             static_cast<T*>(grown_view.data), new_count, value,
                             stream),
              "GrowSlotGpu");
    CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  });
}

#endif  // PE_WITH_CUDA

}  // namespace

void DefineBagKernels(py::module_& module) {
  module.def("embedding_bag_cpu", &EmbeddingBagCpuPy, py::arg("params"),
             py::arg("ids"), py::arg("bags"), py::arg("num_bags"),
             py::kw_only(), py::arg("weights") = py::none(),
             py::arg("combiner") = "mean", py::arg("num_threads") = 0,
             py::arg("dtype") = py::none(),
             R"doc(Pooled lookups of bags of ids (the core of EmbeddingBag;
see cc/core/embedding_bag.h): returns (out [num_bags, ...], factors [N]).

ids: int32/int64 [N] (negative: pruned); bags: int64 [N] in [0, num_bags);
weights: [N] float32 (float64 for a float64 table) or None. Raises IndexError
naming the bag and position of an id >= V.)doc");
  module.def("masked_embedding_bag_grad_cpu", &MaskedEmbeddingBagGradCpuPy,
             py::arg("grad"), py::arg("ids"), py::arg("bags"),
             py::arg("factors"), py::arg("row_mask"), py::kw_only(),
             py::arg("num_threads") = 0, py::arg("dtype") = py::none(),
             R"doc(The gradient of embedding_bag_cpu with respect to params:
returns (rows [U], values [U, ...]) over the distinct permitted rows, in order
of first occurrence (the core of MaskedEmbeddingBagGrad).)doc");
  module.def("masked_embedding_bag_apply_rule_cpu",
             &MaskedEmbeddingBagApplyRuleCpuPy, py::arg("rule"), py::arg("var"),
             py::arg("slots"), py::arg("grad"), py::arg("ids"), py::arg("bags"),
             py::arg("factors"), py::arg("row_mask"),
             py::arg("hyperparameters"), py::kw_only(),
             py::arg("slot_of_row") = py::none(), py::arg("rows_used") = 0,
             py::arg("num_threads") = 0, py::arg("dtype") = py::none(),
             R"doc(The fused bag backward + `rule` in place on NumPy arrays (the
CPU kernel of MaskedEmbeddingBagApplyRule): each distinct permitted row's
gradient, summed from the bags' gradient, steps var and the rule's slots (in
its order) at once. hyperparameters: the rule's, in its order (RULES). With
slot_of_row (float32 [V], written in place; -1: no slot row yet) and
rows_used, the slots are compact, as ...WithSlotMap's CPU kernel keeps them
(the arrays are not grown: a step needing more slot rows is refused).
Returns the slot rows in use after the step (rows_used). Raises IndexError
naming the bag and position of an id >= V, ValueError for a bad bag or map,
and writes nothing then.)doc");
#if PE_WITH_CUDA
  module.def(
      "masked_embedding_bag_grad_gpu",
      [](const py::object& grad, const py::object& ids, const py::object& bags,
         const py::object& factors, const py::object& row_mask,
         const py::object& rows, const py::object& values, uintptr_t stream,
         const std::optional<std::string>& dtype) {
        return std::get<0>(MaskedEmbeddingBagGradGpuPy(grad, ids, bags, factors,
                                                       row_mask, rows, values,
                                                       stream, dtype, 0, 0));
      },
      py::arg("grad"), py::arg("ids"), py::arg("bags"), py::arg("factors"),
      py::arg("row_mask"), py::arg("rows"), py::arg("values"), py::kw_only(),
      py::arg("stream") = 0, py::arg("dtype") = py::none(),
      R"doc(The gradient on device arrays: fills rows[:U] (ascending) and
values[:U] and returns U. rows and values must have room for one row per id.)doc");
  module.def(
      "time_masked_embedding_bag_grad_gpu",
      [](const py::object& grad, const py::object& ids, const py::object& bags,
         const py::object& factors, const py::object& row_mask,
         const py::object& rows, const py::object& values, int warmup,
         int repeats, uintptr_t stream,
         const std::optional<std::string>& dtype) {
        if (repeats <= 0) throw py::value_error("repeats: must be positive");
        return std::get<1>(MaskedEmbeddingBagGradGpuPy(
            grad, ids, bags, factors, row_mask, rows, values, stream, dtype,
            warmup, repeats));
      },
      py::arg("grad"), py::arg("ids"), py::arg("bags"), py::arg("factors"),
      py::arg("row_mask"), py::arg("rows"), py::arg("values"), py::kw_only(),
      py::arg("warmup") = 2, py::arg("repeats") = 10, py::arg("stream") = 0,
      py::arg("dtype") = py::none(),
      "Mean milliseconds of the gradient (both calls), timed with CUDA "
      "events.");
  module.def("masked_embedding_bag_apply_rule_gpu",
             &MaskedEmbeddingBagApplyRuleGpuPy, py::arg("rule"), py::arg("var"),
             py::arg("slots"), py::arg("grad"), py::arg("ids"), py::arg("bags"),
             py::arg("factors"), py::arg("row_mask"),
             py::arg("hyperparameters"), py::kw_only(),
             py::arg("slot_of_row") = py::none(), py::arg("rows_used") = 0,
             py::arg("stream") = 0, py::arg("dtype") = py::none(),
             R"doc(masked_embedding_bag_apply_rule_cpu on device arrays (the
GPU core, cc/core/embedding_bag_apply_gpu.h); same arguments and errors. Runs
on `stream` and waits for it.)doc");
  module.def("grow_slot_gpu", &GrowSlotGpuPy, py::arg("old"), py::arg("grown"),
             py::arg("initial"), py::kw_only(), py::arg("stream") = 0,
             py::arg("dtype") = py::none(),
             R"doc(A compact slot grown on the device (GrowSlotGpu, what the
slot-map GPU kernel does when the slots are full): grown's first old.size
elements from old, the rest `initial`.)doc");
#endif
}

}  // namespace partial_embedding
