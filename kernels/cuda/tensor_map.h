// Tensor maps for the TMA unit's tiled copies (cp.async.bulk.tensor), made on the host through the
// runtime's driver entry point: the kernels library links no libcuda of its own.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace hyscale::cuda {

// A row-major bf16 matrix [rows, cols] at `base` (rows `cols * 2` bytes apart, a multiple of 16)
// copied as boxes of box_rows rows x 64 columns into 128-byte-swizzled shared memory: the layout
// of wgmma.cuh's swizzled_offset, one column block a box. Rows past `rows` land as zeros.
CUtensorMap bf16_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows,
                          const char* op);

// A row-major table [rows, cols] of 4-byte floats or 8-byte words at `base`, its rows `stride`
// elements apart (a multiple of 16 bytes), copied as unswizzled boxes of box_rows rows x box_cols
// columns. What lies past `rows` or `cols` lands as zeros.
CUtensorMap table_tile_map(const void* base, int element_bytes, int64_t rows, int64_t cols,
                           int64_t stride, int box_cols, int box_rows, const char* op);

}  // namespace hyscale::cuda
