// The dense warm-up's target on tensor cores (indexer_loss_cuda.h, dense_attention_target_fused):
// target[r, s] = (1/H) sum_h exp(scale q_rh . key_s - lse_rh) for the keys s row r sees, formed
// tile by tile from Q and the key rows (DenseTargetTraits), so the [rows, H, keys] logits never
// leave the SM. Per block: the producer warpgroup copies Q (its 128 pairs) once, then the chunk's
// 64-key tiles, a 64-column block at a time, into the ring (each slot with a full and an empty
// mbarrier); each consumer warpgroup accumulates S^T [64 keys x its 64 pairs] over the tile's
// column blocks (wgmma m64n64k16, A the key block, B its Q block, both swizzled in shared memory),
// freeing a slot once its products have read it, then forms exp2(S scale log2(e) - lse log2(e))
// where the row sees the key, sums each row's heads (its columns: in registers, then across the
// quad) and adds the sums into target. A row's heads lie in one warpgroup for H <= 64 (one
// addition onto the zeroed target) and in both for H = 128 (two: the same sum in either order),
// so the result is the same every run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/indexer_loss_cuda.h"
#include "kernels/cuda/indexer_loss_traits.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/warp_specialization.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Tr = DenseTargetTraits;

struct DenseTargetProblem {
  const bf16* q;     // [rows, H, dim]: the block's rows
  const bf16* key;   // [keys, dim]
  const float* lse;  // [rows, H], natural log
  float* target;     // rows of target_stride floats, zeroed
  int64_t target_stride;
  int64_t rows, heads, dim;
  PrefixKeys prefix;  // num_keys: those the block's last row sees
  float scale_log2;   // scale * log2(e)

  __device__ int64_t visible(int64_t row) const { return prefix.visible(row); }
};

struct DenseTargetSync {
  uint64_t q_ready;
  uint64_t full[Tr::kSlots];
  uint64_t empty[Tr::kSlots];
};
static_assert(sizeof(DenseTargetSync) <= Tr::kBarrierBytes);

// The producer warpgroup: Q, then every column block of every tile of the block's keys [begin,
// end), in the order the consumers read them (the ring's n-th block in slot n % kSlots). Thread t
// copies the 16-byte chunk t % 8 of rows t / 8 + 16 i of a block.
__device__ void produce(const DenseTargetProblem& p, bf16* q_tile, bf16* ring,
                        DenseTargetSync& sync, int64_t first_pair, int64_t begin, int64_t end) {
  const int t = threadIdx.x % 128, chunk = t % 8, row0 = t / 8;
  const int blocks = static_cast<int>(p.dim / 64);
  const int64_t pairs = p.rows * p.heads;
  // Q: consumer warpgroup w's pairs are a [64 x dim] tile at q_tile + 64 w dim.
  for (int pair = row0; pair < Tr::kPairs; pair += 16) {
    const int64_t global = first_pair + pair;
    bf16* const tile = q_tile + (pair / 64) * 64 * p.dim;
    const bf16* const src = p.q + (global < pairs ? global : 0) * p.dim + chunk * 8;
    for (int c = 0; c < blocks; ++c) {
      cp_async_16(tile + swizzled_offset<64>(pair % 64, 8 * c + chunk), src + c * 64,
                  global < pairs);
    }
  }
  cp_async_arrive(&sync.q_ready);
  const uint64_t policy = l2_evict_last_policy();  // the next rows' blocks read the same keys
  int64_t n = 0;
  for (int64_t first_key = begin; first_key < end; first_key += Tr::kKeys) {
    for (int c = 0; c < blocks; ++c, ++n) {
      const int slot = static_cast<int>(n % Tr::kSlots);
      mbarrier_wait(&sync.empty[slot], static_cast<uint32_t>((n / Tr::kSlots) & 1) ^ 1);
      bf16* const block = ring + slot * (Tr::kSlotBytes / 2);
#pragma unroll
      for (int i = 0; i < Tr::kKeys / 16; ++i) {
        const int row = row0 + 16 * i;
        const int64_t key = first_key + row;
        const bool valid = key < end;
        cp_async_16_l2(block + swizzled_offset<64>(row, chunk),
                       p.key + (valid ? key : 0) * p.dim + c * 64 + chunk * 8, valid, policy);
      }
      cp_async_arrive(&sync.full[slot]);
    }
  }
}

// Consumer warpgroup `wg`: its 64 pairs against the block's tiles.
__device__ void consume(const DenseTargetProblem& p, const bf16* q_tile, const bf16* ring,
                        DenseTargetSync& sync, int wg, int64_t first_pair, int64_t begin,
                        int64_t end) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int blocks = static_cast<int>(p.dim / 64);
  const int64_t pairs = p.rows * p.heads;
  const bf16* const my_q = q_tile + wg * 64 * p.dim;
  // This thread's columns: pairs 8 j + 2 (lane % 4) + e of the warpgroup (j < 8, e < 2), each
  // with its lse in log2 units (+infinity past the last pair: nothing survives it) and the keys
  // its row sees (the two of a j share a row, H >= 8).
  float lse_log2[8][2];
  int64_t seen[8];
  int64_t row_of[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t pair = first_pair + 64 * wg + 8 * j + 2 * (lane % 4);
    row_of[j] = pair / p.heads;
    seen[j] = pair < pairs ? p.visible(row_of[j]) : 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      lse_log2[j][e] = pair + e < pairs ? p.lse[pair + e] * 1.4426950408889634f : INFINITY;
    }
  }
  const int heads_per_j = static_cast<int>(p.heads < 64 ? p.heads : 64) / 8;  // j's of a row
  const float inv_heads = 1.f / static_cast<float>(p.heads);
  const int key_lo = 16 * warp + lane / 4, key_hi = key_lo + 8;
  mbarrier_wait(&sync.q_ready, 0);
  fence_async_shared();

  float acc[32];
  int64_t n = 0;
  for (int64_t first_key = begin; first_key < end; first_key += Tr::kKeys) {
    int previous_slot = -1;
    for (int c = 0; c < blocks; ++c, ++n) {
      const int slot = static_cast<int>(n % Tr::kSlots);
      mbarrier_wait(&sync.full[slot], static_cast<uint32_t>((n / Tr::kSlots) & 1));
      fence_async_shared();  // the copies' bytes, for wgmma's reads
      const uint64_t a = matrix_descriptor<64>(ring + slot * (Tr::kSlotBytes / 2), 0, 0);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        Wgmma<64>::run(acc, advance_descriptor<64>(a, ks),
                       matrix_descriptor<64>(my_q, 0, 4 * c + ks), c > 0 || ks > 0);
      }
      wgmma_commit();
      if (previous_slot >= 0) {
        wgmma_wait<1>();  // the previous block's products have read its slot
        mbarrier_arrive(&sync.empty[previous_slot]);
      }
      previous_slot = slot;
    }
    wgmma_wait<0>();
    mbarrier_arrive(&sync.empty[previous_slot]);
    fence_accumulators(acc);

    // Probabilities where the row sees the key, summed over each row's heads: row g of the
    // warpgroup holds j in [g heads_per_j, (g + 1) heads_per_j), then the quad's other columns.
    const int64_t lo = first_key + key_lo, hi = first_key + key_hi;
    float row_lo = 0.f, row_hi = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float base = lse_log2[j][e];
        if (lo < seen[j]) row_lo += exp2f(acc[4 * j + e] * p.scale_log2 - base);
        if (hi < seen[j]) row_hi += exp2f(acc[4 * j + 2 + e] * p.scale_log2 - base);
      }
      if ((j + 1) % heads_per_j != 0) continue;  // (uniform: the row goes on)
      row_lo += __shfl_xor_sync(0xffffffffu, row_lo, 1);
      row_lo += __shfl_xor_sync(0xffffffffu, row_lo, 2);
      row_hi += __shfl_xor_sync(0xffffffffu, row_hi, 1);
      row_hi += __shfl_xor_sync(0xffffffffu, row_hi, 2);
      if (lane % 4 == 0) {
        float* const out = p.target + row_of[j] * p.target_stride;
        if (lo < seen[j]) atomicAdd(out + lo, row_lo * inv_heads);
        if (hi < seen[j]) atomicAdd(out + hi, row_hi * inv_heads);
      }
      row_lo = 0.f;
      row_hi = 0.f;
    }
  }
}

__global__ void __launch_bounds__(Tr::kThreads, 1) dense_target_kernel(DenseTargetProblem p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* const q_tile =
      reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* const ring = q_tile + Tr::kPairs * p.dim;
  auto& sync = *reinterpret_cast<DenseTargetSync*>(ring + Tr::kSlots * (Tr::kSlotBytes / 2));
  // The block's pairs and keys: the chunk blockIdx.x of what its last row sees.
  const int64_t first_pair = static_cast<int64_t>(blockIdx.y) * Tr::kPairs;
  const int64_t last_pair = min(first_pair + Tr::kPairs, p.rows * p.heads) - 1;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * Tr::kKeyChunk;
  const int64_t end = min(begin + Tr::kKeyChunk, p.visible(last_pair / p.heads));
  if (begin >= end) return;  // (uniform across the block: before any barrier)
  if (threadIdx.x == 0) {
    mbarrier_init(&sync.q_ready, 128);
    for (int s = 0; s < Tr::kSlots; ++s) {
      mbarrier_init(&sync.full[s], 128);
      mbarrier_init(&sync.empty[s], 256);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const int wg = warpgroup_index();
  if (wg == 2) {
    produce(p, q_tile, ring, sync, first_pair, begin, end);
  } else {
    consume(p, q_tile, ring, sync, wg, first_pair, begin, end);
  }
}

}  // namespace

bool dense_attention_target_fused_supported(int64_t heads, int64_t dim) {
  return (heads == 8 || heads == 16 || heads == 32 || heads == 64 || heads == 128) &&
         dim % 64 == 0 && dim >= 64 && dim <= Tr::kMaxDimQk;
}

void dense_attention_target_fused(const IndexerShape& shape, int64_t first, int64_t rows,
                                  int64_t heads, int64_t dim, int64_t keys, const void* q,
                                  const void* key, float scale, const float* lse, float* target,
                                  int64_t target_stride, Stream stream) {
  const char* op = "hyscale::dense_indexer_kl (CUDA)";
  if (!dense_attention_target_fused_supported(heads, dim)) {
    throw std::invalid_argument(std::string(op) + ": the fused target takes H in {8, 16, 32, " +
                                "64, 128} and d_qk a multiple of 64 up to 576, got H " +
                                std::to_string(heads) + ", d_qk " + std::to_string(dim));
  }
  if (rows == 0 || keys == 0) return;
  DenseTargetProblem p{static_cast<const bf16*>(q),
                       static_cast<const bf16*>(key),
                       lse,
                       target,
                       target_stride,
                       rows,
                       heads,
                       dim,
                       PrefixKeys{shape.position(first), shape.visibility.tokens_per_key, keys},
                       scale * 1.4426950408889634f};
  const int smem = Tr::smem_bytes(static_cast<int>(dim));
  throw_on_error(
      cudaFuncSetAttribute(dense_target_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
      op, "shared memory size (target)");
  const dim3 grid(static_cast<unsigned>(ceil_div(keys, Tr::kKeyChunk)),
                  static_cast<unsigned>(ceil_div(rows * heads, Tr::kPairs)));
  dense_target_kernel<<<grid, Tr::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  throw_on_error(cudaGetLastError(), op, "target kernel launch");
}

}  // namespace hyscale::cuda
