// The SIMT emulator's own cases (build_tools/simt_selftest.sh): small kernels
// that keep CUDA's rules, which must pass on every seed, and kernels that
// break one rule each, which the emulator must report.
//
//   simt_cases CASE [FIRST_SEED LAST_SEED]
// runs CASE once per seed (default 1 1) in this process; exits 1 at the first
// wrong result (reported through pe_simt::ReportFailure) or CUDA error.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/cub.cuh>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "simt_runtime.h"

namespace {

#define CHECK_CUDA(call)                                                 \
  do {                                                                   \
    const cudaError_t error_ = (call);                                   \
    if (error_ != cudaSuccess) {                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorName(error_));                            \
      return false;                                                      \
    }                                                                    \
  } while (0)

// Faults a case provokes on purpose (the runtime API case's sticky fault).
int64_t expected_faults = 0;

bool Expect(bool ok, const std::string& what) {
  if (!ok) pe_simt::ReportFailure(what);
  return ok;
}

// Device memory for n values of T, copied from `init` if given.
template <typename T>
T* DeviceArray(size_t n, const std::vector<T>* init = nullptr) {
  void* pointer = nullptr;
  if (cudaMalloc(&pointer, n * sizeof(T)) != cudaSuccess) std::abort();
  if (init != nullptr) {
    cudaMemcpy(pointer, init->data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  return static_cast<T*>(pointer);
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t n) {
  std::vector<T> host(n);
  if (cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost) !=
      cudaSuccess) {
    host.clear();
  }
  return host;
}

// --- 1. A block reduction, with or without the barrier inside the loop.
template <bool kBarrier>
__global__ void BlockSumKernel(const int* in, int* out) {
  __shared__ int partial[256];
  const int t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    if (kBarrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

template <bool kBarrier>
bool BlockSum() {
  constexpr int kBlocks = 4, kThreads = 256;
  std::vector<int> values(kBlocks * kThreads);
  std::iota(values.begin(), values.end(), 1);
  int* in = DeviceArray<int>(values.size(), &values);
  int* out = DeviceArray<int>(kBlocks);
  PE_LAUNCH(kBlocks, kThreads, 0, nullptr, BlockSumKernel<kBarrier>)(in, out);
  const std::vector<int> sums = ToHost(out, kBlocks);
  bool ok = sums.size() == kBlocks;
  for (int b = 0; ok && b < kBlocks; ++b) {
    const int first = b * kThreads + 1, last = first + kThreads - 1;
    ok = Expect(
        sums[b] == (first + last) * kThreads / 2,
        "block sum " + std::to_string(b) + " = " + std::to_string(sums[b]));
  }
  cudaFree(in);
  cudaFree(out);
  return ok;
}

// --- 2. A shuffle in a branch half the warp takes: a mask naming exactly the
// branch's lanes is valid, the full mask is not.
__global__ void HalfWarpShuffleKernel(int* out, unsigned mask) {
  int value = static_cast<int>(threadIdx.x) + 100;
  if (threadIdx.x % 32 < 16) value = __shfl_sync(mask, value, 3);
  out[threadIdx.x] = value;
}

bool HalfWarpShuffle(unsigned mask) {
  int* out = DeviceArray<int>(64);
  PE_LAUNCH(1, 64, 0, nullptr, HalfWarpShuffleKernel)(out, mask);
  const std::vector<int> got = ToHost(out, 64);
  bool ok = got.size() == 64;
  for (int t = 0; ok && t < 64; ++t) {
    const int want = t % 32 < 16 ? (t / 32) * 32 + 3 + 100 : t + 100;
    ok = Expect(got[t] == want,
                "half-warp shuffle, thread " + std::to_string(t));
  }
  cudaFree(out);
  return ok;
}

// --- 3. Lanes that exit, and a mask that names them (or not).
__global__ void ExitedLanesKernel(int* out, int live, unsigned mask) {
  if (static_cast<int>(threadIdx.x) >= live) return;
  out[threadIdx.x] = __shfl_sync(mask, static_cast<int>(threadIdx.x) * 2, 1);
}

bool ExitedLanes(bool name_exited) {
  constexpr int kLive = 20;
  int* out = DeviceArray<int>(32);
  const unsigned mask = name_exited ? 0xffffffffu : (1u << kLive) - 1;
  PE_LAUNCH(1, 32, 0, nullptr, ExitedLanesKernel)(out, kLive, mask);
  const std::vector<int> got = ToHost(out, kLive);
  bool ok = got.size() == kLive;
  for (int t = 0; ok && t < kLive; ++t)
    ok = Expect(got[t] == 2, "exited lanes");
  cudaFree(out);
  return ok;
}

// --- 4. Shared memory written in or past its bounds.
__global__ void SharedTileKernel(int* out, int shift) {
  __shared__ int tile[64];
  int* row = tile;  // Through a pointer: ASan's check, not UBSan's bounds.
  row[threadIdx.x + shift] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

bool SharedTile(int shift) {
  int* out = DeviceArray<int>(64);
  PE_LAUNCH(1, 64, 0, nullptr, SharedTileKernel)(out, shift);
  const std::vector<int> got = ToHost(out, 64);
  bool ok = got.size() == 64;
  for (int t = 0; ok && t < 64; ++t)
    ok = Expect(got[t] == 63 - t, "shared tile");
  cudaFree(out);
  return ok;
}

// --- 5. 16-byte loads, aligned or not.
__global__ void WideLoadKernel(const float* rows, int offset, float* out) {
  const float* src = rows + offset + 4 * threadIdx.x;
  const uint4 raw = pe_simt::LoadStreaming(reinterpret_cast<const uint4*>(src));
  float values[4];
  std::memcpy(values, &raw, sizeof(raw));
  out[threadIdx.x] = values[0] + values[1] + values[2] + values[3];
}

bool WideLoad(int offset) {
  std::vector<float> rows(4 * 32 + 4);
  std::iota(rows.begin(), rows.end(), 0.0f);
  float* device_rows = DeviceArray<float>(rows.size(), &rows);
  float* out = DeviceArray<float>(32);
  PE_LAUNCH(1, 32, 0, nullptr, WideLoadKernel)(device_rows, offset, out);
  const std::vector<float> got = ToHost(out, 32);
  bool ok = got.size() == 32;
  for (int t = 0; ok && t < 32; ++t) {
    const float first = static_cast<float>(offset + 4 * t);
    ok = Expect(got[t] == 4 * first + 6, "wide load");
  }
  cudaFree(device_rows);
  cudaFree(out);
  return ok;
}

// --- 6. A result read with or without waiting for the stream.
__global__ void FillKernel(int* out, int value) { out[threadIdx.x] = value; }

bool ReadBack(bool synchronize) {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  int* device = DeviceArray<int>(32);
  int* pinned = nullptr;
  CHECK_CUDA(
      cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(int)));
  for (int i = 0; i < 32; ++i) pinned[i] = 0;
  PE_LAUNCH(1, 32, 0, stream, FillKernel)(device, 7);
  CHECK_CUDA(cudaMemcpyAsync(pinned, device, 32 * sizeof(int),
                             cudaMemcpyDeviceToHost, stream));
  if (synchronize) CHECK_CUDA(cudaStreamSynchronize(stream));
  bool ok = true;
  for (int i = 0; ok && i < 32; ++i) ok = Expect(pinned[i] == 7, "read back");
  if (!ok) return false;  // Leaves the work queued: reported at exit.
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(device));
  return ok;
}

// --- 7. Keys sorted by CUB's DoubleBuffer read from Current() or from the
// buffer passed in.
__global__ void CountUnsortedKernel(const unsigned* keys, int n,
                                    unsigned* bad) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i + 1 < n && keys[i] > keys[i + 1]) atomicAdd(bad, 1u);
}

bool SortedKeys(bool use_current) {
  constexpr int kCount = 1000;
  std::vector<unsigned> keys(kCount);
  std::vector<unsigned> positions(kCount);
  for (int i = 0; i < kCount; ++i) keys[i] = (i * 7919u) % 997u;
  std::iota(positions.begin(), positions.end(), 0u);
  unsigned* key_buffers[2] = {DeviceArray<unsigned>(kCount, &keys),
                              DeviceArray<unsigned>(kCount)};
  unsigned* position_buffers[2] = {DeviceArray<unsigned>(kCount, &positions),
                                   DeviceArray<unsigned>(kCount)};
  cub::DoubleBuffer<unsigned> key_buffer(key_buffers[0], key_buffers[1]);
  cub::DoubleBuffer<unsigned> position_buffer(position_buffers[0],
                                              position_buffers[1]);
  size_t scratch_bytes = 0;
  CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, key_buffer,
                                             position_buffer, kCount, 0, 10));
  void* scratch = nullptr;
  CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
  unsigned* bad = DeviceArray<unsigned>(1);
  CHECK_CUDA(cudaMemset(bad, 0, sizeof(unsigned)));
  CHECK_CUDA(cub::DeviceRadixSort::SortPairs(scratch, scratch_bytes, key_buffer,
                                             position_buffer, kCount, 0, 10));
  const unsigned* sorted = use_current ? key_buffer.Current() : key_buffers[0];
  PE_LAUNCH((kCount + 127) / 128, 128, 0, nullptr, CountUnsortedKernel)(
      sorted, kCount, bad);
  const std::vector<unsigned> unsorted = ToHost(bad, 1);
  const bool ok = Expect(unsorted.size() == 1 && unsorted[0] == 0,
                         "keys not sorted in the buffer read");
  for (unsigned* buffer : {key_buffers[0], key_buffers[1], position_buffers[0],
                           position_buffers[1], bad}) {
    cudaFree(buffer);
  }
  cudaFree(scratch);
  return ok;
}

// --- A deadlock: half a warp at a full-mask shuffle, the other half at
// another collective; and a barrier some threads never reach.
__global__ void DeadlockKernel(int* out) {
  int value = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) {
    value = __shfl_sync(0xffffffffu, value, 0);
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = value;
}

__global__ void BarrierAfterExitKernel(int* out) {
  if (threadIdx.x >= 48) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

bool Synchronized() {
  const cudaError_t error = cudaDeviceSynchronize();
  return Expect(error == cudaSuccess,
                std::string("the kernel failed: ") + cudaGetErrorName(error));
}

bool Deadlock() {
  PE_LAUNCH(1, 32, 0, nullptr, DeadlockKernel)(DeviceArray<int>(32));
  return Synchronized();
}

bool BarrierAfterExit() {
  PE_LAUNCH(1, 64, 0, nullptr, BarrierAfterExitKernel)(DeviceArray<int>(64));
  return Synchronized();
}

// --- Warp collectives that keep the rules.
__global__ void WarpCollectivesKernel(int* out, double* doubles) {
  const int t = static_cast<int>(threadIdx.x + threadIdx.y * blockDim.x);
  const int lane = t % 32;
  int sum = lane;
  for (int delta = 16; delta > 0; delta /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, delta);
  int butterfly = lane;
  for (int mask = 1; mask < 32; mask *= 2)
    butterfly += __shfl_xor_sync(0xffffffffu, butterfly, mask);
  int scan = 1;  // Inclusive scan within 16-lane segments.
  for (int delta = 1; delta < 16; delta *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, scan, delta, 16);
    if (lane % 16 >= delta) scan += up;
  }
  const unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
  const int any = __any_sync(0xffffffffu, lane == 31);
  const int all = __all_sync(0xffffffffu, lane < 31);
  unsigned active = 0;
  if (lane >= 8) active = __activemask();
  if (lane < 8) __syncwarp(0xffu);
  const double wide = __shfl_sync(0xffffffffu, 0.5 * lane, 31 - lane);
  const unsigned long long big =
      __shfl_sync(0xffffffffu, 0x100000000ull * lane, (lane + 1) % 32);
  out[t * 8 + 0] = sum;
  out[t * 8 + 1] = butterfly;
  out[t * 8 + 2] = scan;
  out[t * 8 + 3] = static_cast<int>(ballot);
  out[t * 8 + 4] = any * 2 + all;
  out[t * 8 + 5] = static_cast<int>(active);
  out[t * 8 + 6] = static_cast<int>(big >> 32);
  doubles[t] = wide;
}

bool WarpCollectives() {
  const dim3 block(32, 3);
  int* out = DeviceArray<int>(96 * 8);
  double* doubles = DeviceArray<double>(96);
  PE_LAUNCH(1, block, 0, nullptr, WarpCollectivesKernel)(out, doubles);
  const std::vector<int> got = ToHost(out, 96 * 8);
  const std::vector<double> wide = ToHost(doubles, 96);
  if (got.empty() || wide.empty()) return false;
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
  for (int t = 0; t < 96; ++t) {
    const int lane = t % 32;
    const int* row = &got[t * 8];
    const bool ok = (lane != 0 || row[0] == 496) && row[1] == 496 &&
                    row[2] == lane % 16 + 1 &&
                    row[3] == static_cast<int>(ballot) && row[4] == 2 &&
                    row[5] == (lane >= 8 ? static_cast<int>(0xffffff00u) : 0) &&
                    row[6] == (lane + 1) % 32 && wide[t] == 0.5 * (31 - lane);
    if (!Expect(ok, "warp collectives, thread " + std::to_string(t)))
      return false;
  }
  cudaFree(out);
  cudaFree(doubles);
  return true;
}

// --- Atomics from many blocks, against a host count.
__global__ void AtomicsKernel(const int* values, int n, unsigned* histogram,
                              unsigned long long* smallest, int* largest,
                              float* total, unsigned* claims) {
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += stride) {
    const int v = values[i];
    atomicAdd(&histogram[v % 16], 1u);
    atomicMin(smallest, static_cast<unsigned long long>(v) * 1000 + i % 1000);
    atomicMax(largest, v);
    atomicAdd(total, 1.0f);
    atomicCAS(&claims[v % 16], 0xffffffffu, static_cast<unsigned>(i));
  }
}

bool Atomics() {
  constexpr int kCount = 5000;
  std::mt19937 random(static_cast<unsigned>(pe_simt::Seed()));
  std::vector<int> values(kCount);
  for (int& v : values) v = static_cast<int>(random() % 100000);
  int* device_values = DeviceArray<int>(kCount, &values);
  unsigned* histogram = DeviceArray<unsigned>(16);
  unsigned long long* smallest = DeviceArray<unsigned long long>(1);
  int* largest = DeviceArray<int>(1);
  float* total = DeviceArray<float>(1);
  unsigned* claims = DeviceArray<unsigned>(16);
  CHECK_CUDA(cudaMemset(histogram, 0, 16 * sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(smallest, 0xff, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(largest, 0, sizeof(int)));
  CHECK_CUDA(cudaMemset(total, 0, sizeof(float)));
  CHECK_CUDA(cudaMemset(claims, 0xff, 16 * sizeof(unsigned)));
  PE_LAUNCH(int64_t{7}, 128, 0, nullptr, AtomicsKernel)(
      device_values, kCount, histogram, smallest, largest, total, claims);
  std::vector<unsigned> want(16, 0);
  unsigned long long want_smallest = ~0ull;
  for (int i = 0; i < kCount; ++i) {
    ++want[values[i] % 16];
    want_smallest =
        std::min(want_smallest,
                 static_cast<unsigned long long>(values[i]) * 1000 + i % 1000);
  }
  const std::vector<unsigned> claim = ToHost(claims, 16);
  bool ok = Expect(ToHost(histogram, 16) == want, "atomicAdd histogram") &&
            Expect(ToHost(smallest, 1)[0] == want_smallest, "atomicMin") &&
            Expect(ToHost(largest, 1)[0] ==
                       *std::max_element(values.begin(), values.end()),
                   "atomicMax") &&
            Expect(ToHost(total, 1)[0] == kCount, "atomicAdd float");
  for (int k = 0; ok && k < 16; ++k) {
    ok = Expect(
        want[k] == 0 ? claim[k] == 0xffffffffu : values[claim[k]] % 16 == k,
        "atomicCAS claim");
  }
  for (void* p : std::initializer_list<void*>{
           device_values, histogram, smallest, largest, total, claims}) {
    cudaFree(p);
  }
  return ok;
}

// --- Dynamic shared memory and a grid-stride loop.
__global__ void DynamicSharedKernel(const int* in, int n, int* out) {
  int* staged = pe_simt::DynamicShared<int>();
  const int stride = static_cast<int>(int64_t{gridDim.x} * blockDim.x);
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += stride) {
    staged[threadIdx.x] = in[i] * 2;
    __syncwarp();
    out[i] = staged[threadIdx.x ^ 1] + min(i, 5);
    __syncwarp();
  }
}

bool DynamicShared() {
  constexpr int kCount = 64 * 50;
  std::vector<int> values(kCount);
  std::iota(values.begin(), values.end(), 0);
  int* in = DeviceArray<int>(kCount, &values);
  int* out = DeviceArray<int>(kCount);
  PE_LAUNCH(9, 64, 64 * sizeof(int), nullptr, DynamicSharedKernel)(in, kCount,
                                                                   out);
  const std::vector<int> got = ToHost(out, kCount);
  bool ok = got.size() == kCount;
  for (int i = 0; ok && i < kCount; ++i) {
    ok = Expect(got[i] == 2 * (i ^ 1) + std::min(i, 5),
                "dynamic shared " + std::to_string(i));
  }
  cudaFree(in);
  cudaFree(out);
  return ok;
}

// --- The CUB stand-ins against simple references.
template <typename KeyT>
bool SortReference(std::mt19937_64& random, bool double_buffer) {
  const int n = static_cast<int>(random() % 3000);
  const int end_bit = 1 + static_cast<int>(random() % (sizeof(KeyT) * 8));
  const int begin_bit = static_cast<int>(random() % end_bit);
  std::vector<KeyT> keys(n);
  std::vector<uint32_t> values(n);
  for (int i = 0; i < n; ++i) {
    keys[i] = static_cast<KeyT>(random()) >> (random() % (sizeof(KeyT) * 8));
    values[i] = static_cast<uint32_t>(i);
  }
  std::vector<std::pair<KeyT, uint32_t>> want(n);  // Value = position.
  const KeyT digits =
      end_bit - begin_bit == static_cast<int>(sizeof(KeyT) * 8)
          ? ~KeyT{0}
          : static_cast<KeyT>((KeyT{1} << (end_bit - begin_bit)) - 1);
  for (int i = 0; i < n; ++i) want[i] = {keys[i], values[i]};
  std::sort(want.begin(), want.end(), [&](const auto& a, const auto& b) {
    const KeyT digit_a = (a.first >> begin_bit) & digits;
    const KeyT digit_b = (b.first >> begin_bit) & digits;
    return digit_a != digit_b ? digit_a < digit_b
                              : a.second < b.second;  // Stable.
  });
  KeyT* key_buffers[2] = {DeviceArray<KeyT>(n, &keys), DeviceArray<KeyT>(n)};
  uint32_t* value_buffers[2] = {DeviceArray<uint32_t>(n, &values),
                                DeviceArray<uint32_t>(n)};
  size_t bytes = 0;
  void* scratch = nullptr;
  cub::DoubleBuffer<KeyT> key_buffer(key_buffers[0], key_buffers[1]);
  cub::DoubleBuffer<uint32_t> value_buffer(value_buffers[0], value_buffers[1]);
  const KeyT* sorted_keys = key_buffers[1];
  const uint32_t* sorted_values = value_buffers[1];
  if (double_buffer) {
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, key_buffer, value_buffer, n, begin_bit, end_bit));
    CHECK_CUDA(cudaMalloc(&scratch, bytes));
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
        scratch, bytes, key_buffer, value_buffer, n, begin_bit, end_bit));
    sorted_keys = key_buffer.Current();
    sorted_values = value_buffer.Current();
  } else {
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, key_buffers[0], key_buffers[1], value_buffers[0],
        value_buffers[1], n, begin_bit, end_bit));
    CHECK_CUDA(cudaMalloc(&scratch, bytes));
    CHECK_CUDA(cub::DeviceRadixSort::SortPairs(
        scratch, bytes, key_buffers[0], key_buffers[1], value_buffers[0],
        value_buffers[1], n, begin_bit, end_bit));
  }
  const std::vector<KeyT> got_keys = ToHost(sorted_keys, n);
  const std::vector<uint32_t> got_values = ToHost(sorted_values, n);
  bool ok = got_keys.size() == static_cast<size_t>(n);
  for (int i = 0; ok && i < n; ++i) {
    ok = Expect(got_keys[i] == want[i].first && got_values[i] == want[i].second,
                "SortPairs differs from a stable sort at " + std::to_string(i));
  }
  for (void* p : std::initializer_list<void*>{key_buffers[0], key_buffers[1],
                                              value_buffers[0],
                                              value_buffers[1], scratch}) {
    cudaFree(p);
  }
  return ok;
}

bool ScanAndEncodeReference(std::mt19937_64& random) {
  const int n = 1 + static_cast<int>(random() % 3000);
  std::vector<uint32_t> keys(n);
  uint32_t key = 0;
  for (int i = 0; i < n; ++i) keys[i] = key += random() % 3 == 0;
  std::vector<uint32_t> want_unique, want_counts;
  for (int i = 0; i < n; ++i) {
    if (i == 0 || keys[i] != keys[i - 1]) {
      want_unique.push_back(keys[i]);
      want_counts.push_back(0);
    }
    ++want_counts.back();
  }
  std::vector<uint32_t> want_offsets(n, 0);
  for (size_t i = 1; i < want_counts.size(); ++i) {
    want_offsets[i] = want_offsets[i - 1] + want_counts[i - 1];
  }
  for (int i = static_cast<int>(want_counts.size()); i < n; ++i)
    want_offsets[i] = n;
  uint32_t* in = DeviceArray<uint32_t>(n, &keys);
  uint32_t* unique = DeviceArray<uint32_t>(n);
  uint32_t* counts = DeviceArray<uint32_t>(n);
  uint32_t* num_runs = DeviceArray<uint32_t>(1);
  size_t encode_bytes = 0, scan_bytes = 0;
  CHECK_CUDA(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, in,
                                                unique, counts, num_runs, n));
  CHECK_CUDA(
      cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, counts, n));
  void* scratch = nullptr;
  CHECK_CUDA(cudaMalloc(&scratch, std::max(encode_bytes, scan_bytes)));
  CHECK_CUDA(cudaMemsetAsync(counts, 0, n * sizeof(uint32_t)));
  CHECK_CUDA(cub::DeviceRunLengthEncode::Encode(scratch, encode_bytes, in,
                                                unique, counts, num_runs, n));
  CHECK_CUDA(
      cub::DeviceScan::ExclusiveSum(scratch, scan_bytes, counts, counts, n));
  const uint32_t runs = ToHost(num_runs, 1)[0];
  const std::vector<uint32_t> got_unique = ToHost(unique, runs);
  const std::vector<uint32_t> got_offsets = ToHost(counts, n);
  const bool ok =
      Expect(runs == want_unique.size() && got_unique == want_unique,
             "Encode differs from the reference") &&
      Expect(got_offsets == want_offsets,
             "ExclusiveSum differs from the reference");
  for (void* p :
       std::initializer_list<void*>{in, unique, counts, num_runs, scratch}) {
    cudaFree(p);
  }
  return ok;
}

bool CubReference() {
  std::mt19937_64 random(pe_simt::Seed());
  for (int round = 0; round < 4; ++round) {
    if (!SortReference<uint32_t>(random, true) ||
        !SortReference<uint64_t>(random, true) ||
        !SortReference<uint32_t>(random, false) ||
        !SortReference<uint64_t>(random, false) ||
        !ScanAndEncodeReference(random)) {
      return false;
    }
  }
  return true;
}

// --- The runtime API: errors, memory, streams, events, driver entry points.
__global__ void AddOneKernel(int* values) { values[threadIdx.x] += 1; }

bool RuntimeApi() {
  int* values = DeviceArray<int>(32);
  // Invalid configurations run nothing and set the last error, once.
  PE_LAUNCH(0, 32, 0, nullptr, AddOneKernel)(values);
  if (!Expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "0 blocks"))
    return false;
  PE_LAUNCH(1, dim3(32, 33), 0, nullptr, AddOneKernel)(values);
  if (!Expect(cudaGetLastError() == cudaErrorInvalidConfiguration,
              "1056 threads"))
    return false;
  CHECK_CUDA(cudaGetLastError());
  // Fresh memory is garbage, not zero.
  std::vector<int> host = ToHost(values, 32);
  if (!Expect(host[0] != 0, "fresh cudaMalloc memory is zero")) return false;
  // Pageable memory is staged at the call; pinned memory is read when the
  // copy runs.
  std::vector<int> pageable(32, 1);
  int* pinned = nullptr;
  CHECK_CUDA(
      cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(int)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  CHECK_CUDA(cudaMemcpyAsync(values, pageable.data(), 32 * sizeof(int),
                             cudaMemcpyHostToDevice, stream));
  pageable.assign(32, 5);
  PE_LAUNCH(1u, 32u, 0, stream, AddOneKernel)(values);
  CHECK_CUDA(cudaEventRecord(stop, stream));
  if (!Expect(cudaEventQuery(stop) == cudaErrorNotReady,
              "event query before sync"))
    return false;
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = -1;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  host = ToHost(values, 32);
  if (!Expect(host[5] == 2 && ms >= 0, "pageable copy staged at the call"))
    return false;
  for (int i = 0; i < 32; ++i) pinned[i] = 1;
  CHECK_CUDA(cudaMemcpyAsync(values, pinned, 32 * sizeof(int),
                             cudaMemcpyHostToDevice, stream));
  for (int i = 0; i < 32; ++i) pinned[i] = 9;
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (!Expect(ToHost(values, 32)[0] == 9, "pinned copy read when it runs"))
    return false;
  // Pointer attributes.
  cudaPointerAttributes attributes;
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, values + 3));
  bool ok =
      Expect(attributes.type == cudaMemoryTypeDevice && attributes.device == 0,
             "device");
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, pinned));
  ok = ok && Expect(attributes.type == cudaMemoryTypeHost, "pinned");
  CHECK_CUDA(cudaPointerGetAttributes(&attributes, host.data()));
  ok = ok &&
       Expect(attributes.type == cudaMemoryTypeUnregistered, "unregistered");
  // A copy past an allocation is refused.
  std::fprintf(stderr, "(an expected error follows)\n");
  ok = ok && Expect(cudaMemcpy(values + 1, pinned, 32 * sizeof(int),
                               cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
                    "copy past the allocation");
  cudaGetLastError();
  // Stream-ordered allocation.
  void* async = nullptr;
  CHECK_CUDA(cudaMallocAsync(&async, 100, stream));
  CHECK_CUDA(cudaMemsetAsync(async, 0, 100, stream));
  CHECK_CUDA(cudaFreeAsync(async, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  // The driver path of cc/core/gpu_common.cu.
  decltype(&cuGetProcAddress) get_proc = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  CHECK_CUDA(cudaGetDriverEntryPoint("cuGetProcAddress",
                                     reinterpret_cast<void**>(&get_proc),
                                     cudaEnableDefault, &found));
  decltype(&cuStreamGetCtx) get_ctx = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ok = ok &&
       Expect(found == cudaDriverEntryPointSuccess && get_proc != nullptr &&
                  get_proc("cuStreamGetCtx", reinterpret_cast<void**>(&get_ctx),
                           12000, CU_GET_PROC_ADDRESS_DEFAULT,
                           &status) == CUDA_SUCCESS,
              "driver entry points");
  CUcontext context = nullptr;
  ok = ok &&
       Expect(get_ctx(stream, &context) == CUDA_SUCCESS && context != nullptr,
              "context");
  // A fault is sticky until the device is reset.
  const int64_t faults = pe_simt::FaultCount();
  ++expected_faults;
  std::fprintf(stderr, "(an expected fault follows)\n");
  PE_LAUNCH(1, 32, 0, nullptr, DeadlockKernel)(values);
  ok = ok && Expect(cudaDeviceSynchronize() == cudaErrorLaunchFailure &&
                        cudaMalloc(&async, 4) == cudaErrorLaunchFailure &&
                        pe_simt::FaultCount() == faults + 1,
                    "a fault is sticky");
  pe_simt::ResetDevice();
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(values));
  return ok;
}

const std::map<std::string, std::function<bool()>>& Cases() {
  static const auto* cases = new std::map<std::string, std::function<bool()>>{
      {"reduce_ok", [] { return BlockSum<true>(); }},
      {"reduce_missing_barrier", [] { return BlockSum<false>(); }},
      {"shuffle_partial_mask_ok", [] { return HalfWarpShuffle(0xffffu); }},
      {"shuffle_full_mask_in_branch",
       [] { return HalfWarpShuffle(0xffffffffu); }},
      {"mask_live_lanes_ok", [] { return ExitedLanes(false); }},
      {"mask_names_exited_lane", [] { return ExitedLanes(true); }},
      {"shared_in_bounds_ok", [] { return SharedTile(0); }},
      {"shared_past_array", [] { return SharedTile(1); }},
      {"aligned_load_ok", [] { return WideLoad(0); }},
      {"misaligned_load", [] { return WideLoad(1); }},
      {"synchronized_read_ok", [] { return ReadBack(true); }},
      {"unsynchronized_read", [] { return ReadBack(false); }},
      {"sort_current_ok", [] { return SortedKeys(true); }},
      {"sort_buffer_passed_in", [] { return SortedKeys(false); }},
      {"deadlock", Deadlock},
      {"barrier_after_exit", BarrierAfterExit},
      {"warp_collectives_ok", WarpCollectives},
      {"atomics_ok", Atomics},
      {"dynamic_shared_ok", DynamicShared},
      {"cub_reference_ok", CubReference},
      {"runtime_api_ok", RuntimeApi},
  };
  return *cases;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || Cases().count(argv[1]) == 0) {
    std::fprintf(stderr,
                 "usage: %s CASE [FIRST_SEED LAST_SEED]; cases:", argv[0]);
    for (const auto& entry : Cases())
      std::fprintf(stderr, " %s", entry.first.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const uint64_t first =
      argc > 2 ? std::strtoull(argv[2], nullptr, 10) : pe_simt::Seed();
  const uint64_t last = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : first;
  for (uint64_t seed = first; seed <= last; ++seed) {
    pe_simt::SetSeed(seed);
    const int64_t faults = pe_simt::FaultCount(), expected = expected_faults;
    if (!Cases().at(argv[1])() ||
        pe_simt::FaultCount() - faults != expected_faults - expected) {
      return 1;
    }
  }
  return 0;
}
