// TF-free core of the fused MaskedSparseApplyRule kernel.
//
// One call applies a rule of the table (row_rules.h: SGD, momentum, Adagrad,
// RMSprop, the Adam family, row-wise Adagrad and Adam) lazily to the
// permitted rows of a [num_rows, row_size] table present in a raw (not
// deduplicated) sparse gradient, writing each such row of the variable and of
// its slots in one pass. Rows whose mask is false are never written, slots
// included; rows absent from the gradient are never touched.
//
// The slots of row r are row r of each slot (full-size slots), or, given a
// slot map (compact slots: S slot rows for the permitted rows, S possibly
// much less than num_rows), row slot_indices[k] of each, where k is any
// position of r in `indices`. Only the row the slots are read from and written
// to changes; the step is the same.
//
// For every distinct permitted row r of `indices`, g is the sum of the
// gradient rows at the positions of r, added in position order, starting
// from zero, rounded after each addition as TensorFlow's segment sum does;
// then weight decay (var -= (var * weight_decay) * learning_rate, where it is
// not zero) and the rule's step (row_rules.h), each operation rounded to the
// storage type in Keras' order (16-bit types compute each operation in float
// and round, as TensorFlow's CPU kernels for half and bfloat16 do).
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_

#include <cstdint>
#include <vector>

#include "cc/core/parallel_for.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

// Where the slots of each occurrence are. Without slot indices (null), row
// r's slots are row r of m, v and v_hat. With them, occurrence k's slots are
// row slot_indices[k] of m, v and v_hat, which have num_slot_rows rows; every
// occurrence of a permitted row must name the same slot row, and two
// permitted rows of one step must not name the same one.
template <typename Index>
struct SlotMap {
  const Index* slot_indices = nullptr;
  int64_t num_slot_rows = 0;
};

// The distinct permitted rows of a gradient and where each occurs.
// Group g is row rows[g]; its positions are
// positions[starts[g]] .. positions[starts[g + 1] - 1], in increasing order.
// Groups are numbered in order of first occurrence. slot_rows[g] is group
// g's slot row; slot_rows is empty when each row's slots are its own row.
struct RowGroups {
  std::vector<int64_t> rows;
  std::vector<int64_t> starts;
  std::vector<int64_t> positions;
  std::vector<int64_t> slot_rows;
  int64_t num_groups() const { return static_cast<int64_t>(rows.size()); }
};

// Why a step's inputs were refused; nothing is written then. Positions are
// flat positions of `indices` (and of the slot indices, which have its
// shape).
struct RuleInputError {
  enum class Kind {
    kNone,
    // indices[position] is not in [0, num_rows).
    kIndexOutOfRange,
    // slot_indices[position] is not in [0, num_slot_rows).
    kSlotIndexOutOfRange,
    // Positions `earlier` and `position` hold the same permitted row and
    // different slot rows.
    kRowInTwoSlotRows,
    // Positions `earlier` and `position` are the first positions of two
    // different permitted rows naming the same slot row.
    kSlotRowOfTwoRows,
  };
  Kind kind = Kind::kNone;
  int64_t position = -1;
  int64_t earlier = -1;
  bool ok() const { return kind == Kind::kNone; }
};

// The index values a message about a refused step names, read where the
// indices live (the host, or the GPU): indices[position], indices[earlier],
// slot_indices[position] and slot_indices[earlier], each zero where its
// position is -1 or there are no slot indices.
struct RuleErrorValues {
  int64_t index_at_position = 0;
  int64_t index_at_earlier = 0;
  int64_t slot_at_position = 0;
  int64_t slot_at_earlier = 0;
};

// RuleErrorValues of `error` from host arrays (slot_indices may be null).
template <typename Index>
RuleErrorValues ErrorValuesOf(const RuleInputError& error, const Index* indices,
                              const Index* slot_indices) {
  RuleErrorValues values;
  const auto at = [](const Index* data, int64_t position) -> int64_t {
    return data != nullptr && position >= 0
               ? static_cast<int64_t>(data[position])
               : 0;
  };
  if (error.ok()) return values;
  values.index_at_position = at(indices, error.position);
  values.index_at_earlier = at(indices, error.earlier);
  values.slot_at_position = at(slot_indices, error.position);
  values.slot_at_earlier = at(slot_indices, error.earlier);
  return values;
}

// Groups the positions of `indices` by row, leaving out rows whose mask is
// false and negative indices (pruned positions of a bag, see embedding_bag.h).
// Indices must already be below the number of rows (see FindFirstBadIndex).
// O(n).
template <typename Index>
void GroupPermittedRows(const Index* indices, int64_t num_indices,
                        const bool* row_mask, RowGroups* groups);

// The first half of a step, which writes nothing: checks every index
// against [0, num_rows), then every slot index (of frozen rows too) against
// [0, num_slot_rows), groups the permitted positions, and checks that the
// slot map gives each permitted row one slot row of its own. Reports the
// first failing check, each at its lowest position. O(num_indices).
template <typename Index>
RuleInputError PlanMaskedSparseApply(const Index* indices, int64_t num_indices,
                                     int64_t num_rows,
                                     const SlotMap<Index>& slot_map,
                                     const bool* row_mask, RowGroups* groups);

// Compact slots kept as a map from a row to its slot row (MaskedOptimizer's
// float32 `slot_of_row`, -1 where a row has none yet, and the count of slot
// rows taken): what giving a step's groups their slot rows found.
struct SlotMapPlan {
  enum class Kind {
    kNone,
    // slot_of_row[row] = map_value is neither negative (no slot row) nor a
    // whole number in [0, num_slot_rows).
    kNotASlotRow,
    // Rows `row` and `other_row` both have slot row `slot_row`.
    kSlotRowOfTwoRows,
    // rows_used = `needed` is negative, or the rows that need a slot row
    // would take `needed` slot rows, more than max_slot_rows.
    kTooManySlotRows,
  };
  Kind kind = Kind::kNone;
  int64_t row = -1;
  int64_t other_row = -1;
  double map_value = 0.0;
  int64_t slot_row = -1;
  int64_t needed = 0;
  // On success: the groups that take a new slot row (in group order, the
  // new slot rows rows_used, rows_used + 1, ...), and the count after.
  std::vector<int64_t> new_groups;
  int64_t rows_used_after = 0;
  bool ok() const { return kind == Kind::kNone; }
};

// Fills groups->slot_rows from the map, giving each group whose row has no
// slot row the next free one, in group order (first occurrence), as
// MaskedOptimizer's compact slots do. Writes nothing else; the caller writes
// the new map entries (SlotMapPlan::new_groups) and the count. Checks that
// every slot row a group's row has is a whole number in [0, num_slot_rows),
// that no two groups share one (new ones included), and that at most
// max_slot_rows are taken; reports the first failing check (lowest group).
SlotMapPlan PlanSlotRowsFromMap(const float* slot_of_row, int64_t rows_used,
                                int64_t num_slot_rows, int64_t max_slot_rows,
                                RowGroups* groups);

// The second half: applies `rule` (row_rules.h) to the groups of a
// successful plan: `tables.slots` in the rule's slot order (per-row slots one
// value a slot row), `hyper` in its hyperparameter order. `gradient` is
// [num_indices, row_size], in the position order of `indices`.
//
// Each shard owns a contiguous range of groups. Groups are distinct rows with
// distinct slot rows, and each row's result does not depend on how the groups
// were split: the result is the same bits for any thread count.
template <typename T>
void ApplyPlannedRuleCpu(Rule rule, const RuleTables<T>& tables,
                         const RowGroups& groups, int64_t num_indices,
                         const T* gradient, const RuleHyperparameters<T>& hyper,
                         const CpuParallelism& parallelism);

// The fused bag backward + rule: the same step, each group's gradient summed
// from the bags' gradient `grad` ([num_bags, row_size]) over the group's
// positions (factor * grad[bag], in the compute type, rounded to T once:
// MaskedEmbeddingBagGrad's value for the row, see embedding_bag.h), so the
// [rows, row_size] gradient is never written. `groups` from
// PlanEmbeddingBagGrad, with slot_rows filled for compact slots.
template <typename T>
void ApplyPlannedBagRuleCpu(Rule rule, const RuleTables<T>& tables,
                            const RowGroups& groups, const T* grad,
                            const int64_t* bags,
                            const typename Arith<T>::Compute* factors,
                            const RuleHyperparameters<T>& hyper,
                            const CpuParallelism& parallelism);

// The whole step on the CPU: plans, then applies unless the plan failed
// (nothing is written then). Pass `{}` as slot_map for full-size slots.
template <typename T, typename Index>
RuleInputError MaskedSparseApplyRuleCpu(Rule rule, const RuleTables<T>& tables,
                                        const Index* indices,
                                        int64_t num_indices,
                                        const SlotMap<Index>& slot_map,
                                        const T* gradient, const bool* row_mask,
                                        const RuleHyperparameters<T>& hyper,
                                        const CpuParallelism& parallelism);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_
