// Declares PartialEmbedding>QuantizedLookup: the lookup of a table whose
// frozen rows are int8 (with a per-row scale) and whose trainable rows live
// in a float store.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status QuantizedLookupShape(InferenceContext* c) {
  ShapeHandle codes, scales, store, sorted_ids, store_index, ids;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &codes));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &scales));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &store));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &sorted_ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &store_index));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &ids));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(codes, 0), c->Dim(scales, 0), &unused));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(codes, 1), c->Dim(store, 1), &unused));
  TF_RETURN_IF_ERROR(
      c->Merge(c->Dim(store, 0), c->Dim(sorted_ids, 0), &unused));
  TF_RETURN_IF_ERROR(
      c->Merge(c->Dim(sorted_ids, 0), c->Dim(store_index, 0), &unused));
  c->set_output(0, c->Matrix(c->Dim(ids, 0), c->Dim(codes, 1)));
  c->set_output(1, c->Vector(c->Dim(ids, 0)));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("PartialEmbedding>QuantizedLookup")
    .Input("codes: int8")
    .Input("scales: float")
    .Input("store: float")
    .Input("sorted_ids: int32")
    .Input("store_index: int32")
    .Input("ids: Tindices")
    .Output("rows: float")
    .Output("store_rows: int32")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(QuantizedLookupShape)
    .Doc(R"doc(
Rows of a quantized partial table: float store rows where an id has one,
dequantized int8 rows elsewhere.

For every position i of `ids`, with k the position of `ids[i]` in
`sorted_ids` (found by binary search):
  `rows[i] = store[store_index[k]]` if `ids[i]` is in `sorted_ids`, else
  `rows[i] = float(codes[ids[i]]) / scales[ids[i]]` (one IEEE division per
  value, as Keras dequantizes);
  `store_rows[i]` is that store row, or `S - 1` (the sentinel) for an id
  without one. Every id is checked against [0, V) before anything is written.

codes: int8 `[V, D]`.
scales: float `[V]`.
store: float `[S, D]`; its last row is the sentinel no id has.
sorted_ids: int32 `[S]`, ascending, padded with V.
store_index: int32 `[S]`, the store row of each sorted id, in [0, S).
ids: `[N]`, each in [0, V).
rows: float `[N, D]`.
store_rows: int32 `[N]`.
)doc");

}  // namespace partial_embedding
