// What the pybind11 kernel module's entry points share: NumPy and CUDA array
// views checked for the cores, the cores' element types, num_threads, a
// rule's slots and hyperparameters, and (with CUDA) device selection, a
// stream-ordered workspace and event timing.
#ifndef PARTIAL_EMBEDDING_CC_PYTHON_ARRAYS_H_
#define PARTIAL_EMBEDDING_CC_PYTHON_ARRAYS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"
#include "cc/core/row_update_contract.h"
#if PE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cc/core/masked_scatter_sub_gpu.h"
#endif

namespace partial_embedding {

namespace py = ::pybind11;

enum class ValueType { kFloat16, kBFloat16, kFloat32, kFloat64 };
enum class IndexType { kInt32, kInt64 };

template <typename T>
struct Tag {
  using type = T;
};

// One array as the core sees it: a pointer, a shape and an element type.
struct ArrayView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  char kind = '?';  // NumPy kind: 'f', 'i', 'u', 'b', or 'B' for bfloat16.
  int64_t itemsize = 0;
  bool writable = false;
  std::string dtype_name;
};

inline std::string ShapeString(const std::vector<int64_t>& shape) {
  return FormatDims(shape, ShapeNotation::kNumPy);
}

// Raises the core's message (a shape contract's, empty when satisfied) as
// Python's ValueError.
inline void ThrowIfError(const std::string& message) {
  if (!message.empty()) throw py::value_error(message);
}

inline ArrayView ViewNumpy(const py::array& array, const char* name) {
  if (!(array.flags() & py::array::c_style)) {
    throw py::value_error(std::string(name) + ": must be C-contiguous");
  }
  ArrayView view;
  view.data = const_cast<void*>(array.data());
  view.shape.assign(array.shape(), array.shape() + array.ndim());
  const py::dtype dtype = array.dtype();
  view.kind = dtype.kind();
  view.itemsize = dtype.itemsize();
  view.writable = array.writeable();
  view.dtype_name = py::str(dtype).cast<std::string>();
  if (view.dtype_name == "bfloat16" && view.itemsize == 2) view.kind = 'B';
  return view;
}

inline ValueType ResolveValueType(const ArrayView& view, const char* name,
                                  const std::optional<std::string>& dtype) {
  if (dtype.has_value()) {
    if (*dtype != "bfloat16") {
      throw py::value_error("dtype: only \"bfloat16\" may be given (got \"" +
                            *dtype + "\"); other dtypes come from the arrays");
    }
    if (view.itemsize != 2 ||
        (view.kind != 'u' && view.kind != 'i' && view.kind != 'B')) {
      throw py::value_error(std::string(name) +
                            ": dtype=\"bfloat16\" needs 16-bit integer or "
                            "bfloat16 elements, got " +
                            view.dtype_name);
    }
    return ValueType::kBFloat16;
  }
  if (view.kind == 'B') return ValueType::kBFloat16;
  if (view.kind == 'f') {
    if (view.itemsize == 2) return ValueType::kFloat16;
    if (view.itemsize == 4) return ValueType::kFloat32;
    if (view.itemsize == 8) return ValueType::kFloat64;
  }
  throw py::value_error(std::string(name) + ": dtype " + view.dtype_name +
                        " is not float16, bfloat16, float32 or float64");
}

// Calls f(Tag<T>, Tag<Index>) with the core's types.
template <typename F>
void DispatchTypes(ValueType value_type, IndexType index_type, F&& f) {
  auto with_index = [&](auto value_tag) {
    if (index_type == IndexType::kInt32) {
      f(value_tag, Tag<int32_t>{});
    } else {
      f(value_tag, Tag<int64_t>{});
    }
  };
  switch (value_type) {
    case ValueType::kFloat16:
      with_index(Tag<Float16>{});
      break;
    case ValueType::kBFloat16:
      with_index(Tag<BFloat16>{});
      break;
    case ValueType::kFloat32:
      with_index(Tag<float>{});
      break;
    case ValueType::kFloat64:
      with_index(Tag<double>{});
      break;
  }
}

// A kernel's num_threads argument: as given, or every core where it is not
// positive.
inline int Threads(int num_threads) {
  return num_threads > 0 ? num_threads
                         : static_cast<int>(std::max(
                               1u, std::thread::hardware_concurrency()));
}

// The views of a rule's slots (view: ViewNumpy or ViewCuda), named
// slots[0], slots[1], ...
template <typename Array, typename View>
std::vector<ArrayView> ViewSlots(const std::vector<Array>& slots, View view) {
  std::vector<ArrayView> views;
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::string name = "slots[" + std::to_string(i) + "]";
    views.push_back(view(slots[i], name.c_str()));
  }
  return views;
}

// A rule's hyperparameters as Python gives them, each rounded to T through
// the compute type (as TensorFlow's conversion of a Python float does for
// 16-bit types); zero past the rule's count.
template <typename T>
RuleHyperparameters<T> RoundedHyperparameters(
    const std::vector<double>& hyperparameters) {
  RuleHyperparameters<T> hyper{};
  for (size_t i = 0; i < hyperparameters.size(); ++i) {
    hyper.values[i] = Arith<T>::Store(
        static_cast<typename Arith<T>::Compute>(hyperparameters[i]));
  }
  return hyper;
}

#if PE_WITH_CUDA

// Reads __cuda_array_interface__ (versions 2 and 3).
inline ArrayView ViewCuda(const py::object& array, const char* name) {
  if (!py::hasattr(array, "__cuda_array_interface__")) {
    throw py::value_error(std::string(name) +
                          ": expected a device array with "
                          "__cuda_array_interface__ (CuPy, PyTorch, ...)");
  }
  const py::dict interface = array.attr("__cuda_array_interface__");
  ArrayView view;
  for (const py::handle dim : interface["shape"].cast<py::tuple>()) {
    view.shape.push_back(dim.cast<int64_t>());
  }
  const std::string typestr = interface["typestr"].cast<std::string>();
  if (typestr.size() < 3 || typestr[0] == '>') {
    throw py::value_error(std::string(name) + ": unsupported typestr " +
                          typestr + " (little-endian only)");
  }
  view.kind = typestr[1];
  view.itemsize = std::stoll(typestr.substr(2));
  view.dtype_name = typestr.substr(1);
  const py::tuple data = interface["data"].cast<py::tuple>();
  view.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  view.writable = !data[1].cast<bool>();
  if (interface.contains("strides") && !interface["strides"].is_none()) {
    const py::tuple strides = interface["strides"].cast<py::tuple>();
    int64_t expected = view.itemsize;
    for (int64_t d = static_cast<int64_t>(view.shape.size()) - 1; d >= 0; --d) {
      if (view.shape[d] > 1 && strides[d].cast<int64_t>() != expected) {
        throw py::value_error(std::string(name) + ": must be C-contiguous");
      }
      expected *= view.shape[d];
    }
  }
  return view;
}

inline void CheckCuda(int error, const std::string& what) {
  if (error != 0) {
    throw std::runtime_error(what + " failed: " + GpuErrorString(error));
  }
}

// Runs the core on the device that holds `pointer` (the array `name`).
inline void SelectDeviceOf(const void* pointer, const char* name) {
  cudaPointerAttributes attributes;
  CheckCuda(cudaPointerGetAttributes(&attributes, pointer),
            "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice &&
      attributes.type != cudaMemoryTypeManaged) {
    throw py::value_error(std::string(name) + ": not a device pointer");
  }
  CheckCuda(cudaSetDevice(attributes.device), "cudaSetDevice");
}

// A stream-ordered workspace for one problem.
class Workspace {
 public:
  Workspace(size_t bytes, cudaStream_t stream)
      : bytes_(bytes), stream_(stream) {
    CheckCuda(cudaMallocAsync(&data_, bytes_, stream_), "cudaMallocAsync");
  }
  ~Workspace() { cudaFreeAsync(data_, stream_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Calls run() `warmup` times, then `repeats` times between two CUDA events on
// `stream`, and returns the mean milliseconds of the timed calls.
template <typename Run>
inline double MeanMilliseconds(cudaStream_t stream, int warmup, int repeats,
                               Run&& run) {
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  CheckCuda(cudaEventCreate(&begin), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&end), "cudaEventCreate");
  CheckCuda(cudaEventRecord(begin, stream), "cudaEventRecord");
  for (int i = 0; i < repeats; ++i) run();
  CheckCuda(cudaEventRecord(end, stream), "cudaEventRecord");
  CheckCuda(cudaEventSynchronize(end), "cudaEventSynchronize");
  float elapsed = 0.0f;
  CheckCuda(cudaEventElapsedTime(&elapsed, begin, end), "cudaEventElapsedTime");
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return elapsed / repeats;
}

#endif  // PE_WITH_CUDA

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_PYTHON_ARRAYS_H_
