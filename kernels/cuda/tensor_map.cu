#include "kernels/cuda/tensor_map.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/launch_util.cuh"

namespace hyscale::cuda {

CUtensorMap bf16_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                          const char* op) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  throw_on_error(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                  cudaEnableDefault, &found),
                 op, "cuTensorMapEncodeTiled lookup");
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    throw std::runtime_error(std::string(op) + ": the driver has no cuTensorMapEncodeTiled");
  }
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes, rows apart
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = reinterpret_cast<Encode>(function)(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error(std::string(op) + ": cuTensorMapEncodeTiled failed (" +
                             std::to_string(static_cast<int>(status)) + ") for [" +
                             std::to_string(rows) + " x " + std::to_string(cols) + "] bf16 at " +
                             std::to_string(reinterpret_cast<uintptr_t>(base)));
  }
  return map;
}

}  // namespace hyscale::cuda
