#include "kernels/cuda/tensor_map.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/launch_util.cuh"

namespace hyscale::cuda {

namespace {

// cuTensorMapEncodeTiled of a 2D map, through the runtime's driver entry point.
CUtensorMap encode_2d(const void* base, CUtensorMapDataType type, int element_bytes, int64_t rows,
                      int64_t cols, int64_t stride, int box_cols, int box_rows,
                      CUtensorMapSwizzle swizzle, const char* op) {
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
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * element_bytes};  // bytes
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = reinterpret_cast<Encode>(function)(
      &map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    throw std::runtime_error(
        std::string(op) + ": cuTensorMapEncodeTiled failed (" +
        std::to_string(static_cast<int>(status)) + ") for [" + std::to_string(rows) + " x " +
        std::to_string(cols) + "] of " + std::to_string(element_bytes) + "-byte elements, rows " +
        std::to_string(stride) + " apart, at " + std::to_string(reinterpret_cast<uintptr_t>(base)));
  }
  return map;
}

}  // namespace

CUtensorMap bf16_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                          const char* op) {
  return encode_2d(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, cols, cols, 64, box_rows,
                   CU_TENSOR_MAP_SWIZZLE_128B, op);
}

CUtensorMap table_tile_map(const void* base, int element_bytes, int64_t rows, int64_t cols,
                           int64_t stride, int box_cols, int box_rows, const char* op) {
  if (element_bytes != 4 && element_bytes != 8) {
    throw std::invalid_argument(std::string(op) + ": table elements of " +
                                std::to_string(element_bytes) + " bytes (4 or 8)");
  }
  const auto type =
      element_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_INT64;
  return encode_2d(base, type, element_bytes, rows, cols, stride, box_cols, box_rows,
                   CU_TENSOR_MAP_SWIZZLE_NONE, op);
}

}  // namespace hyscale::cuda
