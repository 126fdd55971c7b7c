// The shape contracts of the bag ops, stated once for every caller: the
// TensorFlow kernels, the ops' shape functions (with the dimensions they
// know, kUnknownDim for the others) and the pybind11 kernel module call the
// checks below and pass their messages on as they are, so the same text
// reaches Python whichever path ran.
//
// A batch of N positions in B bags, over a table of V rows:
//   - the positions: ids [N] and bags [N], and a per-position vector
//     (EmbeddingBag's weights, the gradient's factors) [N]; weights may be
//     absent (the op spells that [0]);
//   - EmbeddingBag: params [V, ...] (rank >= 1), num_bags a scalar >= 0;
//   - MaskedEmbeddingBagGrad: grad [B, ...] (rank >= 1), row_mask [V];
//   - the fused bag gradient + Adam step: var [V, ...]; the slots as
//     cc/core/row_update_contract.h states them (compact with a slot map);
//     the slot map's slot_of_row [V] and slot_rows_used a scalar;
//     grad [B] + var.shape[1:]; factors [N]; row_mask [V].
// The values (ids < V, bags in [0, B), slot rows) are the core's to check
// at run time (CheckBagPositions, PlanSlotRowsFromMap).
//
// Nothing here includes TensorFlow, absl or pybind11: plain dimensions in,
// an error message out (empty when the shapes satisfy the contract).
#ifndef PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_CONTRACT_H_
#define PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_CONTRACT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/row_update_contract.h"

namespace partial_embedding {

// The positions of a batch: ids, bags and a per-position vector named
// `per_position_name` (absent: no weights).
struct BagPositionShapes {
  Dims ids;
  Dims bags;
  std::optional<Dims> per_position;
  const char* per_position_name = "weights";
};

// EmbeddingBag's weights as its op spells them: [0] for none (absent).
inline std::optional<Dims> OpWeights(const Dims& weights) {
  if (weights == Dims{0}) return std::nullopt;
  return weights;
}

// EmbeddingBag's inputs. num_bags_value is the count where the caller knows
// it.
struct BagLookupShapes {
  Dims params;
  BagPositionShapes positions;
  Dims num_bags;
  std::optional<int64_t> num_bags_value;
};

// MaskedEmbeddingBagGrad's inputs (positions: with factors).
struct BagGradShapes {
  Dims grad;
  BagPositionShapes positions;
  Dims row_mask;
};

// The fused bag gradient + Adam step's inputs. The slots are m, v (and
// v_hat); they are compact when the slot map is given (slot_of_row; the
// kernel module's map has no slot_rows_used).
struct BagAdamShapes {
  Dims var;
  std::vector<SlotShape> slots;
  std::optional<Dims> slot_of_row;
  std::optional<Dims> slot_rows_used;
  Dims grad;
  BagPositionShapes positions;
  Dims row_mask;
};

namespace bag_contract {

// `name`: a table-like input, rank >= 1 (`pattern` its shape in words).
inline std::string CheckHasRows(const char* name, const Dims& dims,
                                const char* pattern, ShapeNotation notation) {
  if (!dims.empty()) return std::string();
  return std::string(name) + ": shape " + FormatDims(dims, notation) +
         " must be " + pattern + " (rank >= 1)";
}

// `name`: one entry per row of a table of `num_rows` rows (table_text names
// the table in words).
inline std::string CheckPerRow(const char* name, const Dims& dims,
                               int64_t num_rows, const char* table_text,
                               ShapeNotation notation) {
  if (CompatibleDims(dims, Dims{num_rows})) return std::string();
  return std::string(name) + ": shape " + FormatDims(dims, notation) +
         " must be " + FormatDims(Dims{num_rows}, notation) +
         " (one entry per row of " + table_text + ")";
}

}  // namespace bag_contract

// ids and bags are vectors of one length N, and so is the per-position
// vector when given.
inline std::string CheckBagPositionShapes(const BagPositionShapes& shapes,
                                          ShapeNotation notation) {
  const Dims& per = shapes.per_position.value_or(shapes.ids);
  if (shapes.ids.size() == 1 && CompatibleDims(shapes.bags, shapes.ids) &&
      CompatibleDims(per, shapes.ids)) {
    return std::string();
  }
  const std::string ids = FormatDims(shapes.ids, notation);
  const std::string bags = FormatDims(shapes.bags, notation);
  if (!shapes.per_position.has_value()) {
    return "ids and bags: must be vectors with one entry per position, got "
           "shapes " +
           ids + " and " + bags;
  }
  return std::string("ids, bags and ") + shapes.per_position_name +
         ": must be vectors with one entry per position, got shapes " + ids +
         ", " + bags + " and " + FormatDims(per, notation);
}

// EmbeddingBag: params [V, ...], the positions, num_bags a scalar >= 0.
inline std::string CheckBagLookupShapes(const BagLookupShapes& shapes,
                                        ShapeNotation notation) {
  std::string error =
      bag_contract::CheckHasRows("params", shapes.params, "[V, ...]", notation);
  if (error.empty()) error = CheckBagPositionShapes(shapes.positions, notation);
  if (error.empty()) {
    error = CheckScalarShape("num_bags", shapes.num_bags, notation);
  }
  if (error.empty() && shapes.num_bags_value.value_or(0) < 0) {
    error =
        "num_bags: " + std::to_string(*shapes.num_bags_value) + " must be >= 0";
  }
  return error;
}

// MaskedEmbeddingBagGrad: grad [B, ...], the positions, row_mask [V].
inline std::string CheckBagGradShapes(const BagGradShapes& shapes,
                                      ShapeNotation notation) {
  std::string error =
      bag_contract::CheckHasRows("grad", shapes.grad, "[B, ...]", notation);
  if (error.empty()) error = CheckBagPositionShapes(shapes.positions, notation);
  if (error.empty() && shapes.row_mask.size() != 1) {
    error = "row_mask: shape " + FormatDims(shapes.row_mask, notation) +
            " must be [V] (rank 1)";
  }
  return error;
}

// The fused bag gradient + Adam step, in the order its kernel always
// checked: var, the slots, the slot map, grad, the positions, row_mask.
inline std::string CheckBagAdamShapes(const BagAdamShapes& shapes,
                                      ShapeNotation notation) {
  const Dims& var = shapes.var;
  std::string error =
      bag_contract::CheckHasRows("var", var, "[V, ...]", notation);
  if (!error.empty()) return error;
  const bool compact = shapes.slot_of_row.has_value();
  error = CheckSlotShapes(var, shapes.slots, compact, notation);
  if (error.empty() && compact) {
    error = bag_contract::CheckPerRow("slot_of_row", *shapes.slot_of_row,
                                      var[0], "var", notation);
  }
  if (error.empty() && shapes.slot_rows_used.has_value()) {
    error =
        CheckScalarShape("slot_rows_used", *shapes.slot_rows_used, notation);
  }
  if (!error.empty()) return error;
  const Dims row_shape(var.begin() + 1, var.end());
  const Dims& grad = shapes.grad;
  if (grad.empty() ||
      !CompatibleDims(Dims(grad.begin() + 1, grad.end()), row_shape)) {
    return "grad: shape " + FormatDims(grad, notation) + " must be [B] + " +
           FormatDims(row_shape, notation) + " (var.shape[1:])";
  }
  error = CheckBagPositionShapes(shapes.positions, notation);
  if (!error.empty()) return error;
  return bag_contract::CheckPerRow("row_mask", shapes.row_mask, var[0], "var",
                                   notation);
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_CONTRACT_H_
