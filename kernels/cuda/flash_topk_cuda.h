// CUDA FlashTopK and index_score_gather (sm_90a; tensor cores through wgmma).
//
// Host API over raw device pointers, so this header needs neither libtorch nor CUDA headers; the
// torch binding (kernels/torch/cuda.cc) checks shapes and calls it. Inputs: q [N, H_I, d_I] and
// k [M, d_I] bf16, w [N, H_I] fp32, all contiguous on one device; or, for fp8 scoring, q and k as
// e4m3 rows with their scales (kernels/fp8.h). Outputs follow the contract of kernels/flash_topk.h.
// docs/flash_topk.md explains the algorithm and why it is exact.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_shapes.h"
#include "kernels/shapes.h"

namespace hyscale::cuda {

// Opaque stream handle (cudaStream_t) so that callers need no CUDA headers.
using Stream = void*;

inline constexpr int64_t kMaxTopk = 4096;

// Scratch memory flash_topk needs for `shape` and `topk` (O(rows_per_chunk * topk) bytes, never
// N x M). Rows are processed in chunks so that the bound holds for any N.
size_t flash_topk_workspace_bytes(const IndexerShape& shape, int64_t topk);

struct FlashTopkStats {
  int64_t fallback_rows = 0;  // rows whose sampled threshold missed and were selected exactly again
};

// x [rows, dim] (bf16, or fp32 when !x_is_bf16) -> values [rows, dim] e4m3 and scales [rows], as
// kernels/fp8.h defines them.
void quantize_rows_e4m3(const void* x, bool x_is_bf16, int64_t rows, int64_t dim, uint8_t* values,
                        float* scales, Stream stream);

// The operands of one selection. bf16: q, k bf16, key_scales null. fp8: q, k e4m3 from
// quantize_rows_e4m3, w already multiplied by the query rows' scales, key_scales [M] the keys'.
struct IndexerOperands {
  const void* q;
  const void* k;
  const float* w;
  const float* key_scales = nullptr;
  bool fp8() const { return key_scales != nullptr; }
};

// indices [N, topk] int32 and scores [N, topk] fp32 (scores may be null). `workspace` holds
// flash_topk_workspace_bytes(shape, topk) bytes. Synchronises the stream once per chunk (to learn
// whether any row needs the exact fallback).
FlashTopkStats flash_topk(const IndexerShape& shape, const IndexerOperands& in, int64_t topk,
                          int32_t* indices, float* scores, void* workspace, Stream stream);

// scores [N, topk] at the given indices (-1 -> -infinity), bit-identical to flash_topk's scores for
// the same inputs: both use one scoring routine.
void index_score_gather(const IndexerShape& shape, const void* q, const void* k, const float* w,
                        const int32_t* indices, int64_t topk, float* scores, Stream stream);

// The baseline of DESIGN.md section 4 (b): the same tensor-core scoring, written as an fp32 table
// [rows, M] for rows [row_begin, row_begin + rows) (-infinity where not visible, and in the
// columns from M to table_stride). With `gates` (else null), also each visible pair's ReLU gates
// [rows, M]: bit gate_bit_position(h) (index_score_warpgroup.cuh) is whether head h's product is
// positive (the dense warm-up's backward reads them instead of recomputing the products; entries
// of keys a row does not see are left as they were). Both tables' rows are table_stride >= M
// elements apart.
void index_score_table(const IndexerShape& shape, const void* q, const void* k, const float* w,
                       int64_t row_begin, int64_t rows, float* table, uint64_t* gates,
                       int64_t table_stride, Stream stream);

}  // namespace hyscale::cuda
