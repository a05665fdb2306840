// The dense warm-up's target on tensor cores (indexer_loss_cuda.h, dense_attention_target_fused):
// target[r, s] = (1/H) sum_h exp(scale q_rh . key_s - lse_rh) for the keys s row r sees, formed
// tile by tile from Q and the key rows (DenseTargetTraits), so the [rows, H, keys] logits never
// leave the SM. Per block: one thread of the producer warpgroup has the TMA unit copy Q (its 128
// pairs) once, a column block ahead of each of the first tile's, and the chunk's 64-key tiles, a
// 64-column block at a time, into the ring (each slot with a full and an empty mbarrier; the
// copies complete on the full one, through the async proxy that wgmma reads by, so the consumers
// need no proxy fence). The consumer warpgroups take
// alternate tiles: each accumulates S^T [64 keys x all 128 pairs] over its tile's column blocks
// (wgmma m64n128k16, A the key block, B the Q tile, both swizzled in shared memory), freeing a slot
// once its products have read it, then forms exp2(S scale log2(e) - lse log2(e)) where the row sees
// the key, sums each row's heads (its columns: in registers, then across the quad) and stores the
// sums into target. The two take turns at issuing their products (named barriers): one's
// exponentials run under the other's products. Every (row, key) is one tile's and all of a row's
// heads lie in the block's pairs (H | 128), so it is stored once, whole: the same result every
// run, and no zeroed target to add onto.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/indexer_loss_cuda.h"
#include "kernels/cuda/indexer_loss_traits.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/warp_specialization.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Tr = DenseTargetTraits;

// Q [rows, H, dim] and the keys [keys, dim] come through tensor maps (the kernel's parameters).
struct DenseTargetProblem {
  const float* lse;  // [rows, H], natural log (the target pass)
  float* target;     // rows of target_stride floats
  int64_t target_stride;
  // The lse pass's per-chunk partials, [key chunk][pair] each: the reference (log2 units of the
  // scaled logits) and the sum of exp2(logit - reference) over the chunk's keys the row sees.
  float* partial_max;
  float* partial_sum;
  int64_t rows, heads, dim;
  PrefixKeys prefix;  // num_keys: those the block's last row sees
  float scale_log2;   // scale * log2(e)

  __device__ int64_t visible(int64_t row) const { return prefix.visible(row); }
};

struct DenseTargetSync {
  uint64_t q_ready[Tr::kMaxDimQk / 64];  // Q's column blocks
  uint64_t full[Tr::kSlots];
  uint64_t empty[Tr::kSlots];
  int64_t seen[Tr::kMaxRows];  // keys each of the block's rows sees (0 past the last row)
};
static_assert(sizeof(DenseTargetSync) <= Tr::kBarrierBytes);

// Named barriers: consumer w may issue its next tile's products once it syncs on kTurn + w; the
// lse pass's consumers meet on kSumsDone (kTurn + 2) at the end.
enum DenseTargetBarrier : int { kTurn = 1, kSumsDone = 3 };

// 2^x as one MUFU.EX2; results under 2^-126 (probabilities of no weight) flush to 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The producer: every column block of every tile of the block's keys [begin, end), in the order
// the consumers read them (the ring's n-th block in slot n % kSlots), each of the first tile's
// after Q's same column block, so the first products wait for 24 KB rather than all of Q. One
// thread issues every copy; rows past either map's end land as zeros (Q's rows past the last
// pair; the keys past `end` below the map's end are real and masked by the consumers).
__device__ void produce(const DenseTargetProblem& p, const CUtensorMap& key_map,
                        const CUtensorMap& q_map, bf16* q_tile, bf16* ring, DenseTargetSync& sync,
                        int64_t first_pair, int64_t begin, int64_t end) {
  if (threadIdx.x % 128 != 0) return;
  const int blocks = static_cast<int>(p.dim / 64);
  const uint64_t policy = l2_evict_last_policy();     // the next rows' blocks read the same keys
  const uint64_t q_policy = l2_evict_first_policy();  // read once (the next chunk's is far off)
  int slot = 0;
  uint32_t phase = 0;
  for (int64_t first_key = begin; first_key < end; first_key += Tr::kKeys) {
    for (int c = 0; c < blocks; ++c) {
      if (first_key == begin) {  // Q: one [128 x dim] tile, B of every product
        mbarrier_arrive_expect(&sync.q_ready[c], Tr::kPairs * 64 * 2);
        tma_load_2d(q_tile + c * Tr::kPairs * 64, &q_map, c * 64, static_cast<int>(first_pair),
                    &sync.q_ready[c], q_policy);
      }
      mbarrier_wait(&sync.empty[slot], phase ^ 1);
      mbarrier_arrive_expect(&sync.full[slot], Tr::kSlotBytes);
      tma_load_2d(ring + slot * (Tr::kSlotBytes / 2), &key_map, c * 64, static_cast<int>(first_key),
                  &sync.full[slot], policy);
      if (++slot == Tr::kSlots) {
        slot = 0;
        phase ^= 1;
      }
    }
  }
}

// Probabilities of one tile's keys lo (this thread's accumulator rows acc[4 j + e]) and hi
// (acc[4 j + 2 + e]), summed over each row's heads and written into target: row g of the block
// holds j in [g js, (g + 1) js) (js = H / 8 = 1 << js_shift), then the quad's other columns.
// kMasked: some row of the block does not see every key of the tile (the causal diagonal, the
// chunk's end, rows past the last), so each term and addition checks the row's prefix.
template <bool kMasked>
__device__ __forceinline__ void add_probabilities(const DenseTargetProblem& p, const float* acc,
                                                  const float (&neg_lse)[16][2],
                                                  const int64_t* seen, int64_t first_row,
                                                  int js_shift, int64_t lo, int64_t hi, int lane) {
  const int js = 1 << js_shift;
  const float inv_heads = 1.f / static_cast<float>(p.heads);
  float row_lo = 0.f, row_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int64_t limit = kMasked ? seen[j >> js_shift] : 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p_lo = exp2_ftz(fmaf(acc[4 * j + e], p.scale_log2, neg_lse[j][e]));
      const float p_hi = exp2_ftz(fmaf(acc[4 * j + 2 + e], p.scale_log2, neg_lse[j][e]));
      if (!kMasked || lo < limit) row_lo += p_lo;
      if (!kMasked || hi < limit) row_hi += p_hi;
    }
    if (((j + 1) & (js - 1)) != 0) continue;  // (uniform: the row goes on)
    row_lo += __shfl_xor_sync(0xffffffffu, row_lo, 1);
    row_lo += __shfl_xor_sync(0xffffffffu, row_lo, 2);
    row_hi += __shfl_xor_sync(0xffffffffu, row_hi, 1);
    row_hi += __shfl_xor_sync(0xffffffffu, row_hi, 2);
    if (lane % 4 == 0) {
      float* const out = p.target + (first_row + (j >> js_shift)) * p.target_stride;
      // (A block holds whole rows and a key is in one of its tiles: one store a (row, key).)
      if (!kMasked || lo < limit) out[lo] = row_lo * inv_heads;
      if (!kMasked || hi < limit) out[hi] = row_hi * inv_heads;
    }
    row_lo = 0.f;
    row_hi = 0.f;
  }
}

// The lse pass's running sums: a column's reference moves only when a tile's maximum passes it
// by more than kMaxLag (log2 units), so its terms stay below 2^kMaxLag and it is rarely rescaled.
constexpr float kMaxLag = 8.f;

// (max, sum) += (other_max, other_sum), both sums relative to their maxima (-infinity, 0: empty).
__device__ __forceinline__ void merge_sums(float& max, float& sum, float other_max,
                                           float other_sum) {
  const float merged = fmaxf(max, other_max);
  if (merged == -INFINITY) return;
  sum = sum * exp2_ftz(max - merged) + other_sum * exp2_ftz(other_max - merged);
  max = merged;
}

// One tile's exponentials of keys lo (acc[4 j + e]) and hi (acc[4 j + 2 + e]) into this thread's
// columns' running (max, sum); kMasked as in add_probabilities.
template <bool kMasked>
__device__ __forceinline__ void add_exponentials(const DenseTargetProblem& p, const float* acc,
                                                 float (&run_max)[16][2], float (&run_sum)[16][2],
                                                 const int64_t* seen, int js_shift, int64_t lo,
                                                 int64_t hi) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int64_t limit = kMasked ? seen[j >> js_shift] : 0;
    const bool sees_lo = !kMasked || lo < limit, sees_hi = !kMasked || hi < limit;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float s_lo = sees_lo ? acc[4 * j + e] * p.scale_log2 : -INFINITY;
      const float s_hi = sees_hi ? acc[4 * j + 2 + e] * p.scale_log2 : -INFINITY;
      const float tile_max = fmaxf(s_lo, s_hi);
      float& max = run_max[j][e];
      float& sum = run_sum[j][e];
      if (tile_max > max + kMaxLag) {  // (-infinity + kMaxLag is -infinity: the first key seen)
        sum *= exp2_ftz(max - tile_max);
        max = tile_max;
      }
      if (max != -INFINITY) sum += exp2_ftz(s_lo - max) + exp2_ftz(s_hi - max);
    }
  }
}

// The lse pass's end in a block: each consumer's columns merged over the rows of its
// accumulators (the 8 lanes of a column, then its 4 warps), then both consumers' per pair, into
// the block's partial of its key chunk. `scratch` (Q's tile, free once both consumers' products
// have retired) holds [consumer][warp][pair] (max, sum).
__device__ void publish_sums(const DenseTargetProblem& p, float (&run_max)[16][2],
                             float (&run_sum)[16][2], float* scratch, int wg, int64_t first_pair) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      for (int x = 4; x < 32; x *= 2) {
        const float other_max = __shfl_xor_sync(0xffffffffu, run_max[j][e], x);
        const float other_sum = __shfl_xor_sync(0xffffffffu, run_sum[j][e], x);
        merge_sums(run_max[j][e], run_sum[j][e], other_max, other_sum);
      }
    }
  }
  named_barrier_sync(kSumsDone, Tr::kConsumerThreads);  // both consumers' products retired
  if (lane < 4) {
    float* const mine = scratch + 2 * Tr::kPairs * (4 * wg + warp);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int pair = 8 * j + 2 * lane + e;
        mine[2 * pair] = run_max[j][e];
        mine[2 * pair + 1] = run_sum[j][e];
      }
    }
  }
  named_barrier_sync(kSumsDone, Tr::kConsumerThreads);
  if (wg != 0) return;
  float max = -INFINITY, sum = 0.f;
  for (int part = 0; part < 8; ++part) {  // in a fixed order: the same bits every run
    const float* const theirs = scratch + 2 * Tr::kPairs * part + 2 * t;
    merge_sums(max, sum, theirs[0], theirs[1]);
  }
  const int64_t pair = first_pair + t;
  if (pair < p.rows * p.heads) {
    const int64_t at = static_cast<int64_t>(blockIdx.y) * p.rows * p.heads + pair;
    p.partial_max[at] = max;
    p.partial_sum[at] = sum;
  }
}

// Consumer warpgroup `wg`: all 128 pairs against the block's tiles wg, wg + 2, ...: the target's
// probabilities, or with kLse the running sums of the lse pass.
template <bool kLse>
__device__ void consume(const DenseTargetProblem& p, bf16* q_tile, const bf16* ring,
                        DenseTargetSync& sync, int wg, int64_t first_pair, int64_t begin,
                        int64_t end) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int blocks = static_cast<int>(p.dim / 64);
  const int64_t pairs = p.rows * p.heads;
  // This thread's columns: pairs 8 j + 2 (lane % 4) + e of the block (j < 16, e < 2), each with
  // -lse in log2 units (-infinity past the last pair: nothing survives it).
  // The lse pass's running (max, sum) in the same places.
  float neg_lse[16][2], run_max[16][2], run_sum[16][2];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t pair = first_pair + 8 * j + 2 * (lane % 4) + e;
      if constexpr (kLse) {
        run_max[j][e] = -INFINITY;
        run_sum[j][e] = 0.f;
      } else {
        neg_lse[j][e] = pair < pairs ? p.lse[pair] * -1.4426950408889634f : -INFINITY;
      }
    }
  }
  const int js_shift = __ffs(static_cast<int>(p.heads) / 8) - 1;  // j's of a row: H / 8
  const int64_t first_row = first_pair / p.heads;
  // Keys every row of the block sees (seen is nondecreasing over the rows, 0 past the last one):
  // tiles below them need no check.
  const int64_t all_see = min(sync.seen[0], sync.seen[Tr::kPairs / p.heads - 1]);
  const int key_lo = 16 * warp + lane / 4, key_hi = key_lo + 8;
  const int tiles = static_cast<int>(ceil_div(end - begin, Tr::kKeys));
  // Consumer 0 issues first; each then gives the turn over once its tile's products are issued,
  // if the other has a next tile, so every sync meets exactly one arrival. The turns also keep
  // the ring's parities sound: a consumer waits for block n only after every block before its
  // tile has landed, so slot n % kSlots is at most one phase behind.
  if (wg == 1) named_barrier_arrive(kTurn, Tr::kConsumerThreads);

  float acc[64];
  for (int tile = wg; tile < tiles; tile += 2) {
    named_barrier_sync(kTurn + wg, Tr::kConsumerThreads);
    // The ring's block n = tile * blocks + c is in slot n % kSlots at phase (n / kSlots) & 1, kept
    // by increments: the issue path between two blocks' products stays short.
    const int first_block = tile * blocks;
    int slot = first_block % Tr::kSlots;
    uint32_t phase = static_cast<uint32_t>(first_block / Tr::kSlots) & 1;
    // The slots of the blocks whose products are still queued, newest in the low 4 bits:
    // kQueuedBlocks blocks' products stay queued behind the one running, so the tensor cores do
    // not wait for this warpgroup to wake between blocks.
    uint32_t pending = 0;
    int queued = 0;
    for (int c = 0; c < blocks; ++c) {
      if (tile < 2) mbarrier_wait(&sync.q_ready[c], 0);
      mbarrier_wait(&sync.full[slot], phase);
      const uint64_t a = matrix_descriptor<64>(ring + slot * (Tr::kSlotBytes / 2), 0, 0);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        Wgmma<128>::run(acc, advance_descriptor<64>(a, ks),
                        matrix_descriptor<Tr::kPairs>(q_tile, 0, 4 * c + ks), c > 0 || ks > 0);
      }
      wgmma_commit();
      pending = (pending << 4) | static_cast<uint32_t>(slot);
      if (++queued > Tr::kQueuedBlocks) {
        wgmma_wait<Tr::kQueuedBlocks>();  // block c - kQueuedBlocks's products have read its slot
        mbarrier_arrive(&sync.empty[(pending >> (4 * Tr::kQueuedBlocks)) & 15]);
        --queued;
      }
      if (++slot == Tr::kSlots) {
        slot = 0;
        phase ^= 1;
      }
    }
    if (tile + 1 < tiles) named_barrier_arrive(kTurn + 1 - wg, Tr::kConsumerThreads);
    wgmma_wait<0>();
    for (int i = 0; i < queued; ++i) mbarrier_arrive(&sync.empty[(pending >> (4 * i)) & 15]);
    fence_accumulators(acc);

    const int64_t first_key = begin + static_cast<int64_t>(tile) * Tr::kKeys;
    const int64_t lo = first_key + key_lo, hi = first_key + key_hi;
    if constexpr (kLse) {
      if (first_key + Tr::kKeys <= all_see) {
        add_exponentials<false>(p, acc, run_max, run_sum, sync.seen, js_shift, lo, hi);
      } else {
        add_exponentials<true>(p, acc, run_max, run_sum, sync.seen, js_shift, lo, hi);
      }
    } else if (first_key + Tr::kKeys <= all_see) {
      add_probabilities<false>(p, acc, neg_lse, sync.seen, first_row, js_shift, lo, hi, lane);
    } else {
      add_probabilities<true>(p, acc, neg_lse, sync.seen, first_row, js_shift, lo, hi, lane);
    }
  }
  if constexpr (kLse) {
    publish_sums(p, run_max, run_sum, reinterpret_cast<float*>(q_tile), wg, first_pair);
  }
}

// A block of the target pass (kLse false) or the lse pass: the producer and the two consumers.
template <bool kLse>
__device__ __forceinline__ void run_block(const DenseTargetProblem& p, const CUtensorMap& key_map,
                                          const CUtensorMap& q_map) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  bf16* const q_tile = first_aligned_shared<bf16>(smem_raw);
  bf16* const ring = q_tile + Tr::kPairs * p.dim;
  auto& sync = *reinterpret_cast<DenseTargetSync*>(ring + Tr::kSlots * (Tr::kSlotBytes / 2));
  // The block's pairs and keys: the chunk blockIdx.y of what its last row sees. Blocks run about
  // in the order of blockIdx.x first, so those resident together read one chunk (2.4 MB of keys
  // at d_qk = 576, held in L2) rather than every chunk (all the keys, 38 MB at 32K); each reads
  // its own Q from memory, 6 % of the bytes its keys take from L2.
  const int64_t first_pair = static_cast<int64_t>(blockIdx.x) * Tr::kPairs;
  const int64_t last_pair = min(first_pair + Tr::kPairs, p.rows * p.heads) - 1;
  constexpr int64_t kChunk = Tr::key_chunk(kLse);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kChunk;
  const int64_t end = min(begin + kChunk, p.visible(last_pair / p.heads));
  if (begin >= end) return;  // (uniform across the block: before any barrier)
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&key_map);
    prefetch_tensor_map(&q_map);
    for (int c = 0; c < Tr::kMaxDimQk / 64; ++c) mbarrier_init(&sync.q_ready[c], 1);
    for (int s = 0; s < Tr::kSlots; ++s) {
      mbarrier_init(&sync.full[s], 1);     // the producer's arrival, with the copy's bytes
      mbarrier_init(&sync.empty[s], 128);  // the one consumer of the block's tile
    }
    mbarrier_init_fence();
  }
  if (threadIdx.x < Tr::kMaxRows) {
    const int64_t row = first_pair / p.heads + threadIdx.x;
    sync.seen[threadIdx.x] = row < p.rows ? p.visible(row) : 0;
  }
  __syncthreads();
  const int wg = warpgroup_index();
  // The lse pass's running sums take twice the registers of the target's -lse: the producer gives
  // them up.
  if (wg == 2) {
    if constexpr (kLse) release_registers<Tr::kProducerRegisters>();
    produce(p, key_map, q_map, q_tile, ring, sync, first_pair, begin, end);
  } else {
    if constexpr (kLse) claim_registers<Tr::kConsumerRegisters>();
    consume<kLse>(p, q_tile, ring, sync, wg, first_pair, begin, end);
  }
}

__global__ void __launch_bounds__(Tr::kThreads, 1)
    dense_target_kernel(const DenseTargetProblem p, const __grid_constant__ CUtensorMap key_map,
                        const __grid_constant__ CUtensorMap q_map) {
  run_block<false>(p, key_map, q_map);
}

__global__ void __launch_bounds__(Tr::kThreads, 1)
    dense_lse_kernel(const DenseTargetProblem p, const __grid_constant__ CUtensorMap key_map,
                     const __grid_constant__ CUtensorMap q_map) {
  run_block<true>(p, key_map, q_map);
}

// lse[pair] from the chunks' partials, merged in chunk order (a chunk no block of the pair ran
// holds sum 0 and adds nothing); -infinity where the row sees no key.
__global__ void dense_lse_merge_kernel(const float* partial_max, const float* partial_sum,
                                       int64_t pairs, int chunks, float* lse) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair >= pairs) return;
  float max = -INFINITY, sum = 0.f;
  for (int c = 0; c < chunks; ++c) {
    const int64_t at = c * pairs + pair;
    if (partial_sum[at] > 0.f) merge_sums(max, sum, partial_max[at], partial_sum[at]);
  }
  lse[pair] = max == -INFINITY ? -INFINITY : (max + log2f(sum)) * 0.6931471805599453f;
}

// The lse pass (dense_lse_kernel) or the target pass (dense_target_kernel): a block a kPairs
// pairs of p and key_chunk(kLse) keys of its prefix.
template <bool kLse>
void launch_pass(const DenseTargetProblem& p, const void* q, const void* key, const char* op,
                 cudaStream_t stream) {
  const auto kernel = kLse ? dense_lse_kernel : dense_target_kernel;
  const char* const pass = kLse ? "lse" : "target";
  const int64_t pairs = p.rows * p.heads, keys = p.prefix.num_keys;
  const CUtensorMap key_map = bf16_tile_map(key, keys, p.dim, Tr::kKeys, op);
  const CUtensorMap q_map = bf16_tile_map(q, pairs, p.dim, Tr::kPairs, op);
  const int smem = Tr::smem_bytes(static_cast<int>(p.dim));
  throw_on_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                 op, (std::string("shared memory size (") + pass + ")").c_str());
  const dim3 grid(static_cast<unsigned>(ceil_div(pairs, Tr::kPairs)),
                  static_cast<unsigned>(ceil_div(keys, Tr::key_chunk(kLse))));
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p, key_map, q_map);
  throw_on_error(cudaGetLastError(), op, (std::string(pass) + " kernel launch").c_str());
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
  DenseTargetProblem p{lse,
                       target,
                       target_stride,
                       nullptr,
                       nullptr,
                       rows,
                       heads,
                       dim,
                       PrefixKeys{shape.position(first), shape.visibility.tokens_per_key, keys},
                       scale * 1.4426950408889634f};
  launch_pass<false>(p, q, key, op, static_cast<cudaStream_t>(stream));
}

int64_t dense_attention_lse_fused_workspace(int64_t rows, int64_t heads, int64_t keys) {
  return 2 * ceil_div(keys, Tr::key_chunk(true)) * rows * heads;
}

void dense_attention_lse_fused(const IndexerShape& shape, int64_t first, int64_t rows,
                               int64_t heads, int64_t dim, int64_t keys, const void* q,
                               const void* key, float scale, float* workspace, float* lse,
                               Stream stream) {
  const char* op = "hyscale::dense_indexer_kl (CUDA)";
  if (!dense_attention_target_fused_supported(heads, dim)) {
    throw std::invalid_argument(std::string(op) + ": the fused lse takes H in {8, 16, 32, " +
                                "64, 128} and d_qk a multiple of 64 up to 576, got H " +
                                std::to_string(heads) + ", d_qk " + std::to_string(dim));
  }
  if (rows == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const int64_t pairs = rows * heads;
  const int chunks = static_cast<int>(ceil_div(keys, Tr::key_chunk(true)));
  float* const partial_max = workspace;
  float* const partial_sum = workspace + chunks * pairs;
  // Chunks no block runs (past a row's prefix) keep sum 0: the merge skips them.
  throw_on_error(cudaMemsetAsync(partial_sum, 0, sizeof(float) * chunks * pairs, cuda_stream), op,
                 "lse partials' zeros");
  if (keys > 0) {
    DenseTargetProblem p{nullptr,
                         nullptr,
                         0,
                         partial_max,
                         partial_sum,
                         rows,
                         heads,
                         dim,
                         PrefixKeys{shape.position(first), shape.visibility.tokens_per_key, keys},
                         scale * 1.4426950408889634f};
    launch_pass<true>(p, q, key, op, cuda_stream);
  }
  dense_lse_merge_kernel<<<static_cast<unsigned>(ceil_div(pairs, int64_t{256})), 256, 0,
                           cuda_stream>>>(partial_max, partial_sum, pairs, chunks, lse);
  throw_on_error(cudaGetLastError(), op, "lse merge launch");
}

}  // namespace hyscale::cuda
