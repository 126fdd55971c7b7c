// The shape contracts of the ops that update rows of a table in place,
// stated once for every caller: the TensorFlow kernels, the ops' shape
// functions (with the dimensions they know), the XLA kernels and the pybind11
// kernel module all call the checks below and pass their messages on as they
// are, so the same text reaches Python whichever path ran.
//
// The row update, for a table `var` of shape [V, ...]:
//   - var has rank >= 1 (it has rows);
//   - row_mask is [V]: one entry per row;
//   - the values (updates, gradient) are indices.shape + var.shape[1:].
// An Adam step's slots (m, v, v_hat):
//   - full-size: var's shape;
//   - compact (an op with slot indices or a slot map): [S] + var.shape[1:],
//     one S >= 1 for every slot; slot_indices has indices' shape.
// The hyperparameters are scalars. The bag ops' contract, built on these
// pieces, is in cc/core/embedding_bag_contract.h.
//
// Nothing here includes TensorFlow, absl or pybind11: plain dimensions in,
// an error message out (empty when the shapes satisfy the contract).
#ifndef PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_
#define PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/row_rules.h"

namespace partial_embedding {

using Dims = std::vector<int64_t>;

// How a front end writes shapes in its messages: TensorFlow's
// TensorShape::DebugString ("[4,2]", "[]") or NumPy's tuples ("(4, 2)",
// "(4,)", "()").
enum class ShapeNotation { kTensorFlow, kNumPy };

// A dimension of kUnknownDim is one a shape function does not know yet: it
// prints as "?" (as TensorFlow writes it) and matches any size.
inline constexpr int64_t kUnknownDim = -1;

inline std::string FormatDims(const Dims& dims, ShapeNotation notation) {
  const bool numpy = notation == ShapeNotation::kNumPy;
  std::string text = numpy ? "(" : "[";
  for (size_t d = 0; d < dims.size(); ++d) {
    if (d > 0) text += numpy ? ", " : ",";
    text += dims[d] == kUnknownDim ? "?" : std::to_string(dims[d]);
  }
  if (numpy && dims.size() == 1) text += ",";
  return text + (numpy ? ")" : "]");
}

// The shapes of one row update, and the names its messages give the table
// and the values.
struct RowUpdateShapes {
  Dims var;
  Dims row_mask;
  Dims indices;
  Dims values;
  const char* var_name = "var";
  const char* values_name = "updates";
};

// Checks `shapes` against the contract above. Returns an empty string when
// they satisfy it, else the message for the first violation, naming the
// argument, its shape and the shape it must have, in `notation`.
inline std::string CheckRowUpdateShapes(const RowUpdateShapes& shapes,
                                        ShapeNotation notation) {
  const auto format = [notation](const Dims& dims) {
    return FormatDims(dims, notation);
  };
  const std::string var_text = format(shapes.var);
  if (shapes.var.empty()) {
    return std::string(shapes.var_name) +
           ": the variable must have rank >= 1, got shape " + var_text;
  }
  const Dims mask_expected{shapes.var[0]};
  if (shapes.row_mask != mask_expected) {
    return "row_mask: shape " + format(shapes.row_mask) + " must be " +
           format(mask_expected) +
           " (one entry per row of the variable of shape " + var_text + ")";
  }
  Dims expected = shapes.indices;
  expected.insert(expected.end(), shapes.var.begin() + 1, shapes.var.end());
  if (shapes.values != expected) {
    return std::string(shapes.values_name) + ": shape " +
           format(shapes.values) + " must be " + format(expected) +
           " (indices.shape + " + shapes.var_name +
           ".shape[1:]) for indices of shape " + format(shapes.indices) +
           " and a variable of shape " + var_text;
  }
  return std::string();
}

// Whether two dimensions can be the same size: equal, or either unknown.
inline bool SameDim(int64_t a, int64_t b) {
  return a == b || a == kUnknownDim || b == kUnknownDim;
}

// Whether `a` and `b` can be the same shape: the same rank, and SameDim in
// each dimension.
inline bool CompatibleDims(const Dims& a, const Dims& b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d) {
    if (!SameDim(a[d], b[d])) return false;
  }
  return true;
}

// One slot of an Adam step: its name in messages and its shape.
struct SlotShape {
  const char* name;
  Dims dims;
  bool per_row = false;  // One value a row: [V], or [S] when compact.
};

// Checks the slots (the first names S) against the slot contract above:
// var's shape, or, when `compact`, [S] + var.shape[1:] with one S >= 1 for
// every slot; a per-row slot is [V] (compact: [S]). Unknown dimensions
// (kUnknownDim) match any size; a caller that does not know a slot's rank
// leaves the slot out. Returns the message for the first violation, or an
// empty string.
inline std::string CheckSlotShapes(const Dims& var,
                                   const std::vector<SlotShape>& slots,
                                   bool compact, ShapeNotation notation) {
  for (const SlotShape& slot : slots) {
    const std::string shape_text =
        std::string(slot.name) + ": shape " + FormatDims(slot.dims, notation);
    const size_t rank =
        slot.per_row ? std::min<size_t>(var.size(), 1) : var.size();
    const Dims expected(var.begin(), var.begin() + rank);
    if (!compact) {
      if (CompatibleDims(slot.dims, expected)) continue;
      return shape_text + " does not match " +
             (slot.per_row ? "[V], one value per row of var: "
                           : "var's shape ") +
             FormatDims(expected, notation);
    }
    const Dims& first = slots.front().dims;
    bool ok = !slot.dims.empty() && slot.dims[0] != 0 && !first.empty() &&
              SameDim(slot.dims[0], first[0]) && slot.dims.size() == rank;
    for (size_t d = 1; ok && d < rank; ++d) {
      ok = SameDim(slot.dims[d], var[d]);
    }
    if (ok) continue;
    return shape_text +
           (slot.per_row ? " must be [S], one value per slot row,"
                         : " must be [S] + var.shape[1:]") +
           " with one S >= 1 for all slots (var: " + FormatDims(var, notation) +
           ", " + slots.front().name + ": " + FormatDims(first, notation) + ")";
  }
  return std::string();
}

// The rule a fused op's attrs name (`rule`, with `num_slots` slot
// inputs): an empty string and *rule set, or the message.
inline std::string RuleOfAttrs(const std::string& name, int64_t num_slots,
                               Rule* rule) {
  if (!RuleFromName(name.c_str(), rule)) {
    std::string known;
    for (const RuleInfo& info : kRuleTable) {
      known += std::string(known.empty() ? "" : ", ") + info.name;
    }
    return "rule: '" + name + "' is not a rule of the table (" + known + ")";
  }
  const RuleInfo& info = InfoOf(*rule);
  if (num_slots == info.num_slots) return std::string();
  return "slots: " + std::to_string(num_slots) + " given; rule '" + name +
         "' has " + std::to_string(info.num_slots) + " slot(s)";
}

// Checks that `hyperparameters` is a vector of the rule's hyperparameters
// (unknown dimensions match any size; unknown rank: pass nothing).
inline std::string CheckHyperparametersShape(Rule rule, const Dims& dims,
                                             ShapeNotation notation) {
  const RuleInfo& info = InfoOf(rule);
  const Dims expected{info.num_hyperparameters};
  if (CompatibleDims(dims, expected)) return std::string();
  std::string names;
  for (int i = 0; i < info.num_hyperparameters; ++i) {
    names += std::string(i == 0 ? "" : ", ") + info.hyperparameters[i];
  }
  return "hyperparameters: shape " + FormatDims(dims, notation) + " must be " +
         FormatDims(expected, notation) + " (" + names + ")";
}

// Checks that the input `name` (a hyperparameter, a count) is a scalar.
inline std::string CheckScalarShape(const char* name, const Dims& dims,
                                    ShapeNotation notation) {
  if (dims.empty()) return std::string();
  return std::string(name) + ": shape " + FormatDims(dims, notation) +
         " must be a scalar";
}

// Checks that slot_indices (the slot row of each position) has indices'
// shape. Unknown dimensions match any size.
inline std::string CheckSlotIndicesShape(const Dims& indices,
                                         const Dims& slot_indices,
                                         ShapeNotation notation) {
  if (CompatibleDims(slot_indices, indices)) return std::string();
  return "slot_indices: shape " + FormatDims(slot_indices, notation) +
         " does not match indices' shape " + FormatDims(indices, notation);
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_
