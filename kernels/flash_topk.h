// FlashTopK: fused lightning-indexer scoring and exact top-k selection.
//
// Per query row the kernel streams over the visible keys, keeps a running top-k with a threshold,
// and never writes the [N, M] score table: memory is O(N * topk).
//
// Output contract (every backend):
//   indices [N, topk] int32: the keys of the min(topk, visible) largest scores (ties at the k-th
//     score select the smaller key indices), in ascending key order: position order lets sparse
//     attention's backward walk every query's keys through the sequence in step
//     (docs/sparse_attn.md, "The latent backward"). Unused slots (fewer visible keys than topk)
//     hold -1.
//   scores  [N, topk]: the score of each selected key; -infinity in unused slots.
#pragma once

#include <cstdint>

#include "kernels/shapes.h"

namespace hyscale {

// CPU reference. T is float or double (scores accumulate in T).
template <typename T>
void flash_topk_cpu(const IndexerShape& shape, const T* q, const T* k, const T* w, int64_t topk,
                    int32_t* indices, T* scores, const CpuContext& ctx);

}  // namespace hyscale
