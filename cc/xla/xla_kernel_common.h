// What the XLA kernels of cc/xla share: static input dimensions, and one
// custom call whose results update resource variables in place.
#ifndef PARTIAL_EMBEDDING_CC_XLA_XLA_KERNEL_COMMON_H_
#define PARTIAL_EMBEDDING_CC_XLA_XLA_KERNEL_COMMON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/row_update_contract.h"
#include "tensorflow/compiler/tf2xla/shape_util.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape.h"
#include "xla/shape_util.h"
#include "xla/xla_data.pb.h"

namespace partial_embedding {
namespace xla_kernel {

inline Dims DimsOf(const ::tensorflow::TensorShape& shape) {
  Dims dims;
  for (int d = 0; d < shape.dims(); ++d) dims.push_back(shape.dim_size(d));
  return dims;
}

// A contract check's message (cc/core/row_update_contract.h) as a status:
// OK when empty.
inline absl::Status ContractStatus(const std::string& problem) {
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(problem);
}

// The static dimensions of input `index`; custom calls take no dynamic ones.
inline absl::Status InputDims(::tensorflow::XlaOpKernelContext* ctx, int index,
                              Dims* dims) {
  TF_ASSIGN_OR_RETURN(xla::Shape shape, ctx->InputXlaShape(index));
  if (shape.is_dynamic()) {
    return absl::InvalidArgumentError(
        "the XLA custom call needs static shapes; input " +
        std::to_string(index) + " has a dynamic one");
  }
  dims->assign(shape.dimensions().begin(), shape.dimensions().end());
  return absl::OkStatus();
}

// Emits the typed-FFI custom call `target` over `operands`, whose result i
// (a tuple when there are several) aliases operand i and has shape
// `shapes[i]`, and assigns result i to the resource variable at input
// `variables[i]`. `attributes`: the handler's attributes, an MLIR dictionary
// ("{name = value, ...}"), or empty for none.
inline absl::Status CustomCallUpdatingVariables(
    ::tensorflow::XlaOpKernelContext* ctx, const char* target,
    const std::vector<xla::XlaOp>& operands, const std::vector<int>& variables,
    ::tensorflow::DataType dtype,
    const std::vector<::tensorflow::TensorShape>& shapes,
    const std::string& attributes = "") {
  std::vector<xla::Shape> result_shapes(variables.size());
  for (size_t i = 0; i < variables.size(); ++i) {
    TF_RETURN_IF_ERROR(::tensorflow::TensorShapeToXLAShape(dtype, shapes[i],
                                                           &result_shapes[i]));
  }
  const bool tuple = variables.size() > 1;
  std::vector<std::pair<xla::ShapeIndex, std::pair<int64_t, xla::ShapeIndex>>>
      aliasing;
  for (size_t i = 0; i < variables.size(); ++i) {
    xla::ShapeIndex result_index;
    if (tuple) result_index.push_back(static_cast<int64_t>(i));
    aliasing.emplace_back(
        std::move(result_index),
        std::make_pair(static_cast<int64_t>(i), xla::ShapeIndex()));
  }
  const xla::Shape result_shape =
      tuple ? xla::ShapeUtil::MakeTupleShape(result_shapes) : result_shapes[0];
  const xla::XlaOp result = xla::CustomCall(
      ctx->builder(), target, operands, result_shape, /*opaque=*/attributes,
      /*has_side_effect=*/false, aliasing, /*literal=*/nullptr,
      xla::CustomCallSchedule::SCHEDULE_NONE,
      xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
  for (size_t i = 0; i < variables.size(); ++i) {
    TF_RETURN_IF_ERROR(ctx->AssignVariable(
        variables[i], dtype,
        tuple ? xla::GetTupleElement(result, static_cast<int64_t>(i))
              : result));
  }
  return absl::OkStatus();
}

// The same where every result has one `shape`.
inline absl::Status CustomCallUpdatingVariables(
    ::tensorflow::XlaOpKernelContext* ctx, const char* target,
    const std::vector<xla::XlaOp>& operands, const std::vector<int>& variables,
    ::tensorflow::DataType dtype, const ::tensorflow::TensorShape& shape) {
  return CustomCallUpdatingVariables(
      ctx, target, operands, variables, dtype,
      std::vector<::tensorflow::TensorShape>(variables.size(), shape));
}

}  // namespace xla_kernel
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_XLA_XLA_KERNEL_COMMON_H_
