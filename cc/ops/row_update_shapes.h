// Shape checks shared by the ops that update rows of a table in place: the
// static (shape-inference) side of the contracts in
// cc/core/row_update_contract.h and cc/core/embedding_bag_contract.h, which
// the kernels check at run time, and what a shape function knows of a shape
// in the contracts' terms.
#ifndef PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_
#define PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "cc/core/row_update_contract.h"
#include "cc/kernels/in_place_update.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

// What a shape function knows of `shape`: its dimensions, kUnknownDim for
// the unknown ones; nullopt when even the rank is unknown.
std::optional<Dims> KnownDims(
    ::tensorflow::shape_inference::InferenceContext* c,
    ::tensorflow::shape_inference::ShapeHandle shape);

// KnownDims, or `rank` unknown dimensions where the rank is unknown: the
// input as a contract sees it when it has the rank the contract asks for.
Dims KnownDimsOr(::tensorflow::shape_inference::InferenceContext* c,
                 ::tensorflow::shape_inference::ShapeHandle shape, size_t rank);

// The dimensions of the variable behind resource input `input` (named
// `name` in errors), where its handle data knows them (nullopt otherwise);
// an error where the handle knows a dtype other than `dtype`.
absl::Status VariableDims(::tensorflow::shape_inference::InferenceContext* c,
                          int input, const char* name,
                          ::tensorflow::DataType dtype,
                          std::optional<Dims>* dims);

// Checks that the inputs first, first + 1, ... (named `names`: an Adam
// step's hyperparameters) are scalars, where their rank is known.
absl::Status CheckScalarShapes(
    ::tensorflow::shape_inference::InferenceContext* c, int first,
    absl::Span<const char* const> names);

// Checks, for a table of shape `var_shape` (rank >= 1, V rows), that
// `row_mask` is [V] and that `values` (named `values_name` in errors) is
// indices.shape + var_shape[1:]. `var_name` names the table in errors.
absl::Status CheckRowMaskAndValues(
    ::tensorflow::shape_inference::InferenceContext* c,
    ::tensorflow::shape_inference::ShapeHandle var_shape,
    ::tensorflow::shape_inference::ShapeHandle row_mask,
    ::tensorflow::shape_inference::ShapeHandle indices,
    ::tensorflow::shape_inference::ShapeHandle values, const char* values_name,
    const char* var_name);

// The rule a fused rule op's attrs (`rule`, `num_slots`) name.
absl::Status RuleOfOpAttrs(::tensorflow::shape_inference::InferenceContext* c,
                           Rule* rule);

// Checks that input `input` is the vector of `rule`'s hyperparameters,
// where its shape is known.
absl::Status CheckHyperparametersInput(
    ::tensorflow::shape_inference::InferenceContext* c, Rule rule, int input);

// The shapes of `rule`'s slots (resource inputs first, first + 1, ...) that
// their handles know, named and marked per row as the table says; an error
// where a handle knows a dtype other than `dtype`.
absl::Status RuleSlotShapes(::tensorflow::shape_inference::InferenceContext* c,
                            Rule rule, int first, ::tensorflow::DataType dtype,
                            std::vector<SlotShape>* slots);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_
