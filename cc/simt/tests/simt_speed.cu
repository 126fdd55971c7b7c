// The SIMT emulator's speed (build_tools/simt_selftest.sh runs it once,
// without sanitizers): a grid-stride kernel over 1M elements at 8192 blocks
// of 256 threads, and many small launches with collectives.
//
//   simt_speed
// prints the time per launch and per lane, and exits 1 on a wrong result.
#include <chrono>
#include <cstdio>
#include <vector>

#include "simt_runtime.h"

namespace {

__global__ void ScaleKernel(const float* in, int64_t n, float* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = 2.0f * in[i];
  }
}

__global__ void WarpSumKernel(const int* in, int* out) {
  int value = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int delta = 16; delta > 0; delta /= 2)
    value += __shfl_down_sync(0xffffffffu, value, delta);
  __shared__ int warp_sums[8];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < 8; ++w) total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main() {
  constexpr int64_t kCount = 1 << 20;
  constexpr int kBlocks = 8192, kThreads = 256;
  std::vector<float> host(kCount, 1.5f);
  float *in = nullptr, *out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&in), kCount * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&out), kCount * sizeof(float));
  cudaMemcpy(in, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
  auto start = std::chrono::steady_clock::now();
  PE_LAUNCH(kBlocks, kThreads, 0, nullptr, ScaleKernel)(in, kCount, out);
  cudaDeviceSynchronize();
  const double grid_stride = Seconds(start);
  cudaMemcpy(host.data(), out, kCount * sizeof(float), cudaMemcpyDeviceToHost);
  for (float value : host) {
    if (value != 3.0f) {
      pe_simt::ReportFailure("ScaleKernel: wrong result");
      return 1;
    }
  }
  constexpr int kLaunches = 300, kSmallBlocks = 100;
  std::vector<int> ones(kSmallBlocks * kThreads, 1);
  int *values = nullptr, *sums = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&values), ones.size() * sizeof(int));
  cudaMalloc(reinterpret_cast<void**>(&sums), kSmallBlocks * sizeof(int));
  cudaMemcpy(values, ones.data(), ones.size() * sizeof(int),
             cudaMemcpyHostToDevice);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) {
    PE_LAUNCH(kSmallBlocks, kThreads, 0, nullptr, WarpSumKernel)(values, sums);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  const double small = Seconds(start);
  std::vector<int> got(kSmallBlocks);
  cudaMemcpy(got.data(), sums, kSmallBlocks * sizeof(int),
             cudaMemcpyDeviceToHost);
  for (int sum : got) {
    if (sum != kThreads) {
      pe_simt::ReportFailure("WarpSumKernel: wrong result");
      return 1;
    }
  }
  std::printf(
      "grid-stride 1M elements, %d x %d lanes: %.3f s (%.0f ns a lane)\n",
      kBlocks, kThreads, grid_stride,
      grid_stride * 1e9 / (double{kBlocks} * kThreads));
  std::printf(
      "%d launches of %d x %d lanes with shuffles and a barrier: %.3f s (%.0f "
      "ns a lane)\n",
      kLaunches, kSmallBlocks, kThreads, small,
      small * 1e9 / (double{kLaunches} * kSmallBlocks * kThreads));
  cudaFree(in);
  cudaFree(out);
  cudaFree(values);
  cudaFree(sums);
  return 0;
}
