// The RowAdmissionObserve OpKernel (CPU): row admission's batch step on the
// state variables in place (cc/core/row_admission.h), under their locks,
// never switching them into copy-on-read mode.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/row_admission.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

namespace {

constexpr const char* kStateNames[] = {
    "candidates",     "admitted",      "counts",       "last_seen",    "step",
    "admitted_count", "admitted_list", "evicted_rows", "evicted_count"};
constexpr int kIdsInput = 9;

}  // namespace

template <typename Index>
class RowAdmissionObserveOp : public OpKernel {
 public:
  explicit RowAdmissionObserveOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &policy_.min_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &policy_.capacity));
    std::string eviction;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("eviction", &eviction));
    policy_.lru = eviction == "lru";
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ignore_negative", &ignore_negative_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(kIdsInput);
    VariableInputs state;
    OP_REQUIRES_OK(ctx, state.LookUp(ctx, kStateNames));
    std::vector<int64_t> evicted;
    {
      OrderedLocks<::tensorflow::mutex_lock> locks(state);
      using ::tensorflow::DT_BOOL;
      using ::tensorflow::DT_INT64;
      OP_REQUIRES_OK(ctx, state.CheckInitializedAndDtypes(
                              {DT_BOOL, DT_BOOL, DT_INT64, DT_INT64, DT_INT64,
                               DT_INT64, DT_INT64, DT_INT64, DT_INT64}));
      const int64_t num_rows = state.tensor(0)->NumElements();
      for (int i = 1; i < 4; ++i) {
        OP_REQUIRES(ctx,
                    state.tensor(i)->dims() == 1 &&
                        state.tensor(i)->NumElements() == num_rows,
                    absl::InvalidArgumentError(absl::StrCat(
                        kStateNames[i], ": shape ",
                        state.tensor(i)->shape().DebugString(), " must be [",
                        num_rows, "] (candidates' shape)")));
      }
      for (int i : {4, 5, 8}) {
        OP_REQUIRES(ctx, state.tensor(i)->NumElements() == 1,
                    absl::InvalidArgumentError(absl::StrCat(
                        kStateNames[i], ": must be a scalar, got shape ",
                        state.tensor(i)->shape().DebugString())));
      }
      if (policy_.capacity >= 0) {
        OP_REQUIRES(
            ctx,
            state.tensor(6)->NumElements() == policy_.capacity &&
                *state.tensor(5)->flat<int64_t>().data() <= policy_.capacity,
            absl::InvalidArgumentError(absl::StrCat(
                "admitted_list: shape ", state.tensor(6)->shape().DebugString(),
                " must be [capacity] = [", policy_.capacity,
                "], holding at most that many rows")));
      }
      const Index* id_values = ids.flat<Index>().data();
      const int64_t num_ids = ids.NumElements();
      const int64_t bad =
          FindBadRowId(id_values, num_ids, num_rows, ignore_negative_);
      OP_REQUIRES(
          ctx, bad < 0,
          BadIndexError(ids.shape(), bad,
                        bad < 0 ? 0 : static_cast<int64_t>(id_values[bad]),
                        num_rows));
      // In place: a reader still holding a buffer keeps its values.
      for (int i = 1; i < state.size(); ++i) {
        OP_REQUIRES_OK(ctx, CopyIfShared<CPUDevice>(ctx, state.tensor(i)));
      }
      RowAdmissionState raw;
      raw.candidates = state.tensor(0)->flat<bool>().data();
      raw.admitted = state.tensor(1)->flat<bool>().data();
      raw.counts = state.tensor(2)->flat<int64_t>().data();
      raw.last_seen = state.tensor(3)->flat<int64_t>().data();
      raw.num_rows = num_rows;
      raw.step = state.tensor(4)->flat<int64_t>().data();
      raw.admitted_count = state.tensor(5)->flat<int64_t>().data();
      raw.admitted_list = state.tensor(6)->flat<int64_t>().data();
      raw.evicted_rows = state.tensor(7)->flat<int64_t>().data();
      raw.evicted_room = state.tensor(7)->NumElements();
      raw.evicted_count = state.tensor(8)->flat<int64_t>().data();
      ObserveRowAdmissionBatch(policy_, raw, id_values, num_ids, &evicted);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK(
        ctx,
        ctx->allocate_output(
            0, TensorShape({static_cast<int64_t>(evicted.size())}), &output));
    std::copy(evicted.begin(), evicted.end(), output->flat<int64_t>().data());
  }

 private:
  RowAdmissionPolicy policy_;
  bool ignore_negative_ = false;
};

#define PE_REGISTER_ROW_ADMISSION(Index)                               \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>RowAdmissionObserve") \
                              .Device(::tensorflow::DEVICE_CPU)        \
                              .TypeConstraint<Index>("Tindices"),      \
                          RowAdmissionObserveOp<Index>);
PE_REGISTER_ROW_ADMISSION(int32_t)
PE_REGISTER_ROW_ADMISSION(int64_t)
#undef PE_REGISTER_ROW_ADMISSION

}  // namespace partial_embedding
