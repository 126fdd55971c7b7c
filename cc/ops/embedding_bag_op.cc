// Declares PartialEmbedding>EmbeddingBag (pooled lookups of bags of ids) and
// its gradient PartialEmbedding>MaskedEmbeddingBagGrad: attrs, shape
// functions that check the contract of cc/core/embedding_bag_contract.h on
// the dimensions they know, and documentation for every input.
#include <cstdint>

#include "cc/core/embedding_bag_contract.h"
#include "cc/ops/row_update_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// The inputs by position: EmbeddingBag's params, ids, bags, num_bags and
// weights; MaskedEmbeddingBagGrad's grad, ids, bags, factors and row_mask.
constexpr int kParams = 0;
constexpr int kGrad = 0;
constexpr int kIds = 1;
constexpr int kBags = 2;
constexpr int kNumBags = 3;
constexpr int kFactors = 3;
constexpr int kWeights = 4;
constexpr int kRowMask = 4;

// The positions as far as the shape function knows them: ids and bags,
// with the per-position input `per_position` (named `name`).
BagPositionShapes PositionShapes(InferenceContext* c, int per_position,
                                 const char* name) {
  return {KnownDimsOr(c, c->input(kIds), 1), KnownDimsOr(c, c->input(kBags), 1),
          KnownDimsOr(c, c->input(per_position), 1), name};
}

// N, as far as ids, bags and weights know it (the contract has checked that
// they agree; weights of length 0 may mean no weights).
DimensionHandle PositionCount(InferenceContext* c) {
  for (const int input : {kIds, kBags, kWeights}) {
    const DimensionHandle n = c->Dim(c->input(input), 0);
    if (c->ValueKnown(n) && (input != kWeights || c->Value(n) > 0)) return n;
  }
  return c->UnknownDim();
}

absl::Status EmbeddingBagShape(InferenceContext* c) {
  BagLookupShapes shapes;
  shapes.params = KnownDimsOr(c, c->input(kParams), 1);
  shapes.positions = PositionShapes(c, kWeights, "weights");
  shapes.positions.per_position = OpWeights(*shapes.positions.per_position);
  shapes.num_bags = KnownDimsOr(c, c->input(kNumBags), 0);
  const ::tensorflow::Tensor* num_bags = c->input_tensor(kNumBags);
  if (num_bags != nullptr && num_bags->dims() == 0) {
    shapes.num_bags_value = num_bags->scalar<int64_t>()();
  }
  TF_RETURN_IF_ERROR(
      ContractStatus(CheckBagLookupShapes(shapes, ShapeNotation::kTensorFlow)));
  ShapeHandle params;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(kParams), 1, &params));
  DimensionHandle num_bags_dim;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(kNumBags, &num_bags_dim));
  ShapeHandle row_shape;
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  ShapeHandle output;
  TF_RETURN_IF_ERROR(
      c->Concatenate(c->Vector(num_bags_dim), row_shape, &output));
  c->set_output(0, output);
  c->set_output(1, c->Vector(PositionCount(c)));
  return absl::OkStatus();
}

absl::Status MaskedEmbeddingBagGradShape(InferenceContext* c) {
  const BagGradShapes shapes{KnownDimsOr(c, c->input(kGrad), 1),
                             PositionShapes(c, kFactors, "factors"),
                             KnownDimsOr(c, c->input(kRowMask), 1)};
  TF_RETURN_IF_ERROR(
      ContractStatus(CheckBagGradShapes(shapes, ShapeNotation::kTensorFlow)));
  ShapeHandle grad;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(kGrad), 1, &grad));
  ShapeHandle row_shape;
  TF_RETURN_IF_ERROR(c->Subshape(grad, 1, &row_shape));
  ShapeHandle values;
  TF_RETURN_IF_ERROR(
      c->Concatenate(c->Vector(c->UnknownDim()), row_shape, &values));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, values);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("PartialEmbedding>EmbeddingBag")
    .Input("params: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("num_bags: int64")
    .Input("weights: Tcompute")
    .Output("output: dtype")
    .Output("factors: Tcompute")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .SetShapeFn(EmbeddingBagShape)
    .Doc(R"doc(
Pooled lookups of bags of ids: one vector per bag, the weighted sum, mean or
sqrtn of its rows.

Position i holds id `ids[i]` of bag `bags[i]`. An id < 0 is pruned: it counts
for nothing (weight included). For every bag b:
  `output[b] = sum_i factors[i] * params[ids[i]]` over its positions, where
  `factors[i] = w[i] * scale[b]`, `w[i] = weights[i]` (1 without weights) and
  scale is 1 (sum), 1 / sum(w) (mean) or 1 / sqrt(sum(w^2)) (sqrtn) over the
  bag's unpruned positions, 0 where that sum is 0: an empty bag gives zeros.
Sums run in Tcompute in position order and round to dtype once. Every id is
checked against V first; the error names the bag and the id's place in it.

params: `[V, ...]`, the table (an aliasing read of the variable).
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, num_bags).
num_bags: scalar B.
weights: `[N]` weights, or `[0]` for no weights (every weight 1). float for
  half, bfloat16 and float tables; double for double tables.
output: `[B] + params.shape[1:]`.
factors: `[N]`, each position's factor (0 for a pruned one): what the
  gradient takes.
)doc");

REGISTER_OP("PartialEmbedding>MaskedEmbeddingBagGrad")
    .Input("grad: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("factors: Tcompute")
    .Input("row_mask: bool")
    .Output("rows: Tindices")
    .Output("values: dtype")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .SetShapeFn(MaskedEmbeddingBagGradShape)
    .Doc(R"doc(
The gradient of EmbeddingBag with respect to params, as sparse rows: one per
distinct permitted id, summed straight from the bags' gradients.

For every distinct id r with `row_mask[r]` true among the unpruned positions:
  `values[g] = sum_i factors[i] * grad[bags[i]]` over the positions of r,
in position order, in Tcompute, rounded to dtype once; `rows[g] = r`. On the
CPU rows come in order of first occurrence, on a GPU in ascending order.
Frozen ids and pruned (negative) ids contribute nothing, and no
`[N] + row shape` tensor is made. Every id is checked against V first.

grad: `[B] + row shape`, the gradient of EmbeddingBag's output.
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, B).
factors: `[N]`, EmbeddingBag's factors output.
row_mask: bool `[V]`; true where a row may learn.
rows: `[U]` the distinct permitted rows.
values: `[U] + row shape`.
)doc");

}  // namespace partial_embedding
