// Declares PartialEmbedding>EmbeddingBag (pooled lookups of bags of ids) and
// its gradient PartialEmbedding>MaskedEmbeddingBagGrad: attrs, strict shape
// functions and documentation for every input.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// ids, bags and a per-position vector (weights or factors) are one vector
// each of the same length; `per_position` may also be empty (no weights).
absl::Status CheckPositions(InferenceContext* c, int ids_input,
                            int per_position_input,
                            bool per_position_may_be_empty,
                            DimensionHandle* num_positions) {
  ShapeHandle ids, bags, per_position;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(ids_input), 1, &ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(ids_input + 1), 1, &bags));
  TF_RETURN_IF_ERROR(
      c->WithRank(c->input(per_position_input), 1, &per_position));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(ids, 0), c->Dim(bags, 0), num_positions));
  const DimensionHandle given = c->Dim(per_position, 0);
  if (per_position_may_be_empty && c->ValueKnown(given) &&
      c->Value(given) == 0) {
    return absl::OkStatus();
  }
  return c->Merge(*num_positions, given, num_positions);
}

absl::Status EmbeddingBagShape(InferenceContext* c) {
  ShapeHandle params;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &params));
  DimensionHandle num_positions;
  TF_RETURN_IF_ERROR(CheckPositions(c, 1, 4, true, &num_positions));
  ShapeHandle num_bags_shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &num_bags_shape));
  DimensionHandle num_bags;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &num_bags));
  ShapeHandle row_shape;
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  ShapeHandle output;
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(num_bags), row_shape, &output));
  c->set_output(0, output);
  c->set_output(1, c->Vector(num_positions));
  return absl::OkStatus();
}

absl::Status MaskedEmbeddingBagGradShape(InferenceContext* c) {
  ShapeHandle grad;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &grad));
  DimensionHandle num_positions;
  TF_RETURN_IF_ERROR(CheckPositions(c, 1, 3, false, &num_positions));
  ShapeHandle row_mask;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &row_mask));
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
