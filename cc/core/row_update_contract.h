// The shape contract of every op that updates rows of a table in place,
// stated once for the run-time checks: the TensorFlow kernels
// (cc/kernels/in_place_update.cc) and the pybind11 kernel module
// (cc/python/kernels_module.cc) both call CheckRowUpdateShapes before the
// first write. The static layer stays where the shapes are still symbolic:
// the ops' shape functions (cc/ops/row_update_shapes.cc) and the Python
// wrappers' check (python/partial_embedding/_internal/checks.py).
//
// The contract, for a table `var` of shape [V, ...]:
//   - var has rank >= 1 (it has rows);
//   - row_mask is [V]: one entry per row;
//   - the values (updates, gradient) are indices.shape + var.shape[1:].
//
// Nothing here includes TensorFlow, absl or pybind11: plain dimensions in,
// an error message out.
#ifndef PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_
#define PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace partial_embedding {

using Dims = std::vector<int64_t>;

// How a front end writes shapes in its messages: TensorFlow's
// TensorShape::DebugString ("[4,2]", "[]") or NumPy's tuples ("(4, 2)",
// "(4,)", "()").
enum class ShapeNotation { kTensorFlow, kNumPy };

inline std::string FormatDims(const Dims& dims, ShapeNotation notation) {
  const bool numpy = notation == ShapeNotation::kNumPy;
  std::string text = numpy ? "(" : "[";
  for (size_t d = 0; d < dims.size(); ++d) {
    if (d > 0) text += numpy ? ", " : ",";
    text += std::to_string(dims[d]);
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

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_CONTRACT_H_
