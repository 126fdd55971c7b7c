// Shape checks shared by the ops that update rows of a table in place.
#include "cc/ops/row_update_shapes.h"

#include "absl/strings/str_cat.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status CheckRowMaskAndValues(InferenceContext* c, ShapeHandle var_shape,
                                   ShapeHandle row_mask, ShapeHandle indices,
                                   ShapeHandle values, const char* values_name,
                                   const char* var_name) {
  ShapeHandle unused;
  if (!c->Merge(row_mask, c->Vector(c->Dim(var_shape, 0)), &unused).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_mask: shape ", c->DebugString(row_mask),
        " must be [V] for a variable of shape ", c->DebugString(var_shape)));
  }
  ShapeHandle row_shape;
  TF_RETURN_IF_ERROR(c->Subshape(var_shape, 1, &row_shape));
  ShapeHandle expected;
  TF_RETURN_IF_ERROR(c->Concatenate(indices, row_shape, &expected));
  if (!c->Merge(values, expected, &unused).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        values_name, ": shape ", c->DebugString(values), " must be ",
        c->DebugString(expected), " (indices.shape + ", var_name,
        ".shape[1:]) for indices of shape ", c->DebugString(indices),
        " and a variable of shape ", c->DebugString(var_shape)));
  }
  return absl::OkStatus();
}

}  // namespace partial_embedding
