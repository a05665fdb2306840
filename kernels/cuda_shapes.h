// The head shapes the CUDA kernels (kernels/cuda) are compiled for, in plain C++: the CUDA
// dispatch checks each call against them, and the trainer checks a job before it trains on a GPU
// (so a CPU-only build knows them too).
#pragma once

#include <cstdint>

// (d_qk, d_v) pairs of sparse_attn, as an X-macro the CUDA dispatch instantiates.
#define HYSCALE_SPARSE_ATTN_DIMS(X) X(64, 64) X(128, 128) X(192, 128) X(576, 512)

namespace hyscale {

// Lightning indexer (flash_topk, index_score_gather, the indexer loss): H_I and d_I.
inline bool cuda_indexer_shape_supported(int64_t heads, int64_t dim) {
  return (heads == 16 || heads == 32 || heads == 64) && (dim == 64 || dim == 128);
}

// Query-group sizes G of the sparse attention kernels (a group's G adjacent queries load the
// union of their keys once); 0 in an op's `group` leaves the choice to the kernels.
inline bool cuda_query_group_supported(int64_t group) {
  return group == 1 || group == 2 || group == 4 || group == 8 || group == 16;
}

inline bool cuda_sparse_attn_dims_supported(int64_t dim_qk, int64_t dim_v) {
  bool ok = false;
#define HYSCALE_SA_OK(DQ, DV) ok = ok || (dim_qk == DQ && dim_v == DV);
  HYSCALE_SPARSE_ATTN_DIMS(HYSCALE_SA_OK)
#undef HYSCALE_SA_OK
  return ok;
}

// The same lists in words, for the errors of every place that checks them.
inline constexpr const char* kCudaIndexerShapes = "H_I in {16, 32, 64} and d_I in {64, 128}";
inline constexpr const char* kCudaQueryGroups = "G in {1, 2, 4, 8, 16}";
inline constexpr const char* kCudaSparseAttnDims =
    "(d_qk, d_v) in {(64, 64), (128, 128), (192, 128), (576, 512)}";

}  // namespace hyscale
