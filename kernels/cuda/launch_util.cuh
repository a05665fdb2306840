// Host-side helpers every CUDA launcher shares.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace hyscale::cuda {

// Launch and copy errors become exceptions naming the op ("hyscale::flash_topk (CUDA)") and the
// step, which the torch binding reports as the op's error.
inline void throw_on_error(cudaError_t status, const char* op, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(op) + ": " + what + ": " + cudaGetErrorString(status));
  }
}

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The first tile of item `item` of a grid walking its tiles from a rotated start: items start
// about 1 / resident of an item's time apart, so starting item i at tile
// (i mod resident) tiles / resident puts the items in flight on the same tile index.
__device__ inline int rotated_first_tile(int64_t item, int resident, int tiles) {
  return static_cast<int>(item % resident * tiles / resident);
}

// How many blocks of `kernel` the device holds at once.
template <class Kernel>
unsigned resident_blocks(Kernel kernel, int threads, int smem, const char* op) {
  int device = 0, sms = 0, per_sm = 0;
  throw_on_error(cudaGetDevice(&device), op, "device");
  throw_on_error(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op,
                 "SM count");
  throw_on_error(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), op,
                 "occupancy");
  return static_cast<unsigned>(std::max(1, sms * per_sm));
}

}  // namespace hyscale::cuda
