// Shape checks shared by the ops that update rows of a table in place.
#include "cc/ops/row_update_shapes.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

std::optional<Dims> KnownDims(InferenceContext* c, ShapeHandle shape) {
  if (!c->RankKnown(shape)) return std::nullopt;
  Dims dims;
  for (int d = 0; d < c->Rank(shape); ++d) {
    dims.push_back(c->ValueKnown(c->Dim(shape, d)) ? c->Value(c->Dim(shape, d))
                                                   : kUnknownDim);
  }
  return dims;
}

Dims KnownDimsOr(InferenceContext* c, ShapeHandle shape, size_t rank) {
  return KnownDims(c, shape).value_or(Dims(rank, kUnknownDim));
}

absl::Status VariableDims(InferenceContext* c, int input, const char* name,
                          ::tensorflow::DataType dtype,
                          std::optional<Dims>* dims) {
  dims->reset();
  const auto* handle_data = c->input_handle_shapes_and_types(input);
  if (handle_data == nullptr || handle_data->empty()) return absl::OkStatus();
  const auto& table = (*handle_data)[0];
  if (table.dtype != ::tensorflow::DT_INVALID && table.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": dtype ", ::tensorflow::DataTypeString(table.dtype),
        " does not match dtype ", ::tensorflow::DataTypeString(dtype)));
  }
  *dims = KnownDims(c, table.shape);
  return absl::OkStatus();
}

absl::Status CheckScalarShapes(InferenceContext* c, int first,
                               absl::Span<const char* const> names) {
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    const std::optional<Dims> dims = KnownDims(c, c->input(first + i));
    if (!dims.has_value()) continue;
    TF_RETURN_IF_ERROR(ContractStatus(
        CheckScalarShape(names[i], *dims, ShapeNotation::kTensorFlow)));
  }
  return absl::OkStatus();
}

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

absl::Status RuleOfOpAttrs(InferenceContext* c, Rule* rule) {
  std::string name;
  TF_RETURN_IF_ERROR(c->GetAttr("rule", &name));
  int64_t num_slots = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
  return ContractStatus(RuleOfAttrs(name, num_slots, rule));
}

absl::Status CheckHyperparametersInput(InferenceContext* c, Rule rule,
                                       int input) {
  const std::optional<Dims> dims = KnownDims(c, c->input(input));
  if (!dims.has_value()) return absl::OkStatus();
  return ContractStatus(
      CheckHyperparametersShape(rule, *dims, ShapeNotation::kTensorFlow));
}

absl::Status RuleSlotShapes(InferenceContext* c, Rule rule, int first,
                            ::tensorflow::DataType dtype,
                            std::vector<SlotShape>* slots) {
  const RuleInfo& info = InfoOf(rule);
  for (int i = 0; i < info.num_slots; ++i) {
    std::optional<Dims> dims;
    TF_RETURN_IF_ERROR(
        VariableDims(c, first + i, info.slot_names[i], dtype, &dims));
    if (dims.has_value()) {
      slots->push_back({info.slot_names[i], *std::move(dims), info.per_row[i]});
    }
  }
  return absl::OkStatus();
}

}  // namespace partial_embedding
