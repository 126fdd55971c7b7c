// Shape checks shared by the ops that update rows of a table in place: the
// static (shape-inference) side of the contract in
// cc/core/row_update_contract.h, which the kernels check at run time.
#ifndef PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_
#define PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_

#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

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

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_OPS_ROW_UPDATE_SHAPES_H_
