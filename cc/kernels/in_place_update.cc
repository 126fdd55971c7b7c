// Helpers shared by the OpKernels that write a resource variable in place.
#include "cc/kernels/in_place_update.h"

#include "absl/strings/str_cat.h"

namespace partial_embedding {

std::string FormatIndexPosition(const ::tensorflow::TensorShape& shape,
                                int64_t flat) {
  if (shape.dims() <= 1) return absl::StrCat("[", flat, "]");
  std::string coords;
  for (int d = shape.dims() - 1; d >= 0; --d) {
    const int64_t size = shape.dim_size(d);
    coords =
        absl::StrCat(flat % size, d == shape.dims() - 1 ? "" : ", ", coords);
    flat /= size;
  }
  return absl::StrCat("[", coords, "]");
}

}  // namespace partial_embedding
