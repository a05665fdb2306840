// Host-side helpers every CUDA launcher shares.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace hyscale::cuda
