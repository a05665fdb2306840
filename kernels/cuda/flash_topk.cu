// FlashTopK on the GPU: fused lightning-indexer scoring and exact top-k without a score table.
//
// Per chunk of query rows (docs/flash_topk.md has the why):
//   1. sample pass: score every row against a strided sample of the keys (1/stride of the work);
//   2. threshold:  per row, the score that about 2*topk of its visible keys should reach;
//   3. main pass:  score every visible key, keep (score, key) only when score >= threshold, in a
//                  bounded per-row candidate buffer;
//   4. finish:     per row, exact top-k of the candidates (radix select, ties to the smaller key,
//                  bitonic sort into key order); rows whose threshold missed (fewer than topk
//                  candidates, or more than the buffer holds) are listed...
//   5. fallback:   ...and rescored with no threshold into full-row buffers, then finished alike.
// Scores are never written for all keys (except in the fallback, for the few listed rows).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/flash_topk_cuda.h"
#include "kernels/cuda/index_score_warpgroup.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/radix_select.cuh"

namespace hyscale::cuda {
namespace {

constexpr float kNegInf = -INFINITY;

void check(cudaError_t status, const char* what) {
  throw_on_error(status, "hyscale::flash_topk (CUDA)", what);
}

// Where a block's rows come from: rows [row0, row0 + rows), or the listed rows.
struct RowSet {
  int64_t row0 = 0;
  int rows = 0;
  const int* list = nullptr;
  __device__ int64_t row(int slot) const { return list ? list[slot] : row0 + slot; }
};

struct ScoreParams {
  const void* q;            // [N, H, D] bf16 or e4m3 (the kernel's Traits::Element)
  const void* keys;         // [num_array_keys, D]: all keys, or every key_stride-th (sample)
  const float* w;           // [N, H]; fp8: times the query rows' scales
  const float* key_scales;  // fp8: [num_keys], indexed by key (not array key)
  RowSet rows;
  int64_t q_offset;
  int64_t tokens_per_key;
  int64_t num_keys;    // M of the full key array (visibility)
  int64_t key_stride;  // array key i is key i * key_stride
  int64_t num_array_keys;
  const float* thresholds;  // [rows] or null (keep every visible key)
  int capacity;             // candidate slots per row
  float* cand_scores;       // [rows, capacity]
  int* cand_keys;           // [rows, capacity] or null (sample pass: scores only)
  int* counts;              // [rows]: candidates found (may exceed capacity)
  float* table;             // score-table mode: [rows, table_stride]
  int64_t table_stride;
  uint64_t* gates;  // score-table mode: [rows, table_stride] head bits (gate_bits), or null
};

__device__ __forceinline__ int64_t visible_keys(int64_t row, int64_t q_offset,
                                                int64_t tokens_per_key, int64_t num_keys) {
  const int64_t v = (q_offset + row + 1) / tokens_per_key;
  return v < 0 ? 0 : (v < num_keys ? v : num_keys);
}

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

enum class ScoreMode { kCandidates, kTable };

// Rows of q or keys in the 2-byte units of the tile helpers (index_tile_traits.cuh).
template <class Traits>
__device__ __forceinline__ const __nv_bfloat16* row_units(const void* rows, int64_t row) {
  return static_cast<const __nv_bfloat16*>(rows) + row * Traits::kRowUnits;
}

// Streams consecutive tiles of a key array into shared-memory stages with cp.async. A thread
// always copies the same 16-byte chunk column of the same rows of a tile, so its swizzled shared
// offsets and its global addresses move by constants, and only the end of the array needs a check
// (the generic row loader recomputed row, chunk and swizzle for each copy: more issue slots than
// the scoring epilogue, as the SASS showed).
template <class Traits, int kThreads>
class KeyTileStream {
 public:
  __device__ KeyTileStream(const void* keys, int64_t num_keys, __nv_bfloat16* stages, int thread)
      : keys_(static_cast<const char*>(keys)), num_keys_(num_keys), first_row_(thread / kChunks) {
    const int chunk = thread % kChunks;
    src_ = keys_ + first_row_ * kRowBytes + chunk * 16;
    dst_ = stages + swizzled_offset<Traits::kKeysPerTile>(first_row_, chunk);
  }

  // Tile `tile` into stage buffer `stage`; rows past the array are zero-filled.
  __device__ __forceinline__ void load(int64_t tile, int stage) const {
    const int64_t first_key = tile * Traits::kKeysPerTile + first_row_;
    const char* src = src_ + tile * (Traits::kKeysPerTile * kRowBytes);
    __nv_bfloat16* dst = dst_ + stage * Traits::kKeyTileElems;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const bool valid = first_key + pass * kRowsPerPass < num_keys_;
      cp_async_16(dst + pass * kRowsPerPass * 64,
                  valid ? src + pass * kRowsPerPass * kRowBytes : keys_, valid);
    }
  }

 private:
  static constexpr int kRowBytes = Traits::kRowUnits * 2;
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks a row
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kPasses = Traits::kKeysPerTile / kRowsPerPass;
  // Rows a thread copies differ by multiples of 8: the same swizzle phase (wgmma.cuh).
  static_assert(kThreads % kChunks == 0 && kRowsPerPass % 8 == 0 &&
                    Traits::kKeysPerTile % kRowsPerPass == 0,
                "a thread's rows must share their swizzle phase");

  const char* keys_;
  int64_t num_keys_;
  int first_row_;
  const char* src_;
  __nv_bfloat16* dst_;
};

// One warpgroup a block scores kQueriesPerBlock query rows against each key tile (cp.async,
// kStages deep) with one wgmma chain for all of them. Causal: the block walks the keys its latest
// row sees; the other rows' scores past their own row are dropped. fp8: the products are e4m3 and
// each score is multiplied by its key's scale after the head sum (kernels/fp8.h).
template <class Traits, ScoreMode kMode>
__global__ void __launch_bounds__(SelectTraits::kThreads, SelectTraits::kBlocksPerSm)
    score_rows_kernel(ScoreParams p) {
  constexpr int kQueries = SelectTraits::kQueriesPerBlock;
  constexpr int kQueryRows = kQueries * Traits::kHeads;  // the queries' head rows, stacked
  // No static shared memory: the dynamic tiles start at the 1 KB-aligned window base.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* queries = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* key_tiles = queries + kQueries * Traits::kQueryElems;
  int* found = reinterpret_cast<int*>(key_tiles + SelectTraits::kStages * Traits::kKeyTileElems);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Causal rows late in the sequence cost the most: start them first, so the tail is short.
  const int block = gridDim.x - 1 - blockIdx.x;
  const int first_slot = block * kQueries;
  auto array_visible = [&](int slot) -> int64_t {
    if (slot >= p.rows.rows) return 0;
    const int64_t v = visible_keys(p.rows.row(slot), p.q_offset, p.tokens_per_key, p.num_keys);
    return min(ceil_div(v, p.key_stride), p.num_array_keys);
  };

  int64_t visible[kQueries];
  float threshold[kQueries];
  float weights[kQueries][Traits::kHeadsPerLane];
  int64_t block_visible = 0;
#pragma unroll
  for (int q = 0; q < kQueries; ++q) {
    const int slot = first_slot + q;
    const bool active = slot < p.rows.rows;
    visible[q] = array_visible(slot);
    block_visible = max(block_visible, visible[q]);
    threshold[q] = (active && p.thresholds) ? p.thresholds[slot] : kNegInf;
#pragma unroll
    for (int j = 0; j < Traits::kHeadsPerLane; ++j) weights[q][j] = 0.f;
    if (active)
      load_lane_weights<Traits>(p.w + p.rows.row(slot) * Traits::kHeads, lane, weights[q]);
    const int64_t first_head_row = p.rows.row(slot) * Traits::kHeads;
    load_rows_async<Traits::kRowUnits, kQueryRows>(
        queries, q * Traits::kHeads, Traits::kHeads, threadIdx.x, SelectTraits::kThreads,
        [&](int h) { return active ? row_units<Traits>(p.q, first_head_row + h) : nullptr; });
  }
  if (threadIdx.x < kQueries) found[threadIdx.x] = 0;

  const int64_t tiles = ceil_div(block_visible, Traits::kKeysPerTile);
  const KeyTileStream<Traits, SelectTraits::kThreads> key_stream(p.keys, p.num_array_keys,
                                                                 key_tiles, threadIdx.x);
  // Tile t is scored in two wgmma halves (queries 0-1, then 2-3): the first half's epilogue runs
  // while the tensor cores work on the second. (Carrying a half across iterations would hide the
  // other epilogue too, but ptxas then serializes the wgmmas.)
  constexpr int kHalf = kQueries / 2;
  auto issue = [&](const __nv_bfloat16* key_tile, int first_query,
                   float(&acc)[kHalf * Traits::kHeads / 2]) {
    fence_accumulators(acc);
    wgmma_fence();
    issue_key_tile<Traits, kHalf, kQueryRows>(key_tile, queries, first_query * Traits::kHeads, acc);
    wgmma_commit();
  };
  constexpr int kAhead = SelectTraits::kStages - 1;  // tiles in flight while one is scored
#pragma unroll
  for (int tile = 0; tile < kAhead; ++tile) {
    if (tile < tiles) key_stream.load(tile, tile);
    cp_async_commit();  // the queries travel in the first group
  }

  const int tile_key = emitted_key(warp, lane);
  // One finished tile of query q: keep (or write) the score of this lane's key.
  auto emit = [&](int q, int64_t base, float2 scores, float key_scale, uint2 gates) {
    const int slot = first_slot + q;
    float score = lane % 4 == 0 ? scores.x : scores.y;
    if constexpr (Traits::kFp8) score *= key_scale;
    const int64_t key = base + tile_key;
    const bool valid = tile_key >= 0 && key < visible[q];
    if constexpr (kMode == ScoreMode::kCandidates) {
      const bool keep = valid && score >= threshold[q];
      const uint32_t ballot = __ballot_sync(0xffffffffu, keep);
      int warp_base = 0;
      if (lane == 0 && ballot != 0) warp_base = atomicAdd(&found[q], __popc(ballot));
      warp_base = __shfl_sync(0xffffffffu, warp_base, 0);
      // Candidates land in any order; the finish does not depend on it.
      const int pos = warp_base + __popc(ballot & lanemask_lt());
      if (keep && pos < p.capacity) {
        const int64_t out = static_cast<int64_t>(slot) * p.capacity + pos;
        p.cand_scores[out] = score;
        if (p.cand_keys) p.cand_keys[out] = static_cast<int>(key * p.key_stride);
      }
    } else {
      const int64_t row = static_cast<int64_t>(slot) * p.table_stride;
      if (valid) p.table[row + key] = score;
      if (p.gates) {  // every lane its 16 bits of both its keys' words
        auto* const words = reinterpret_cast<uint16_t*>(p.gates);
        const int64_t lo = base + 16 * warp + lane / 4, hi = lo + 8;
        if (lo < visible[q]) words[4 * (row + lo) + lane % 4] = static_cast<uint16_t>(gates.x);
        if (hi < visible[q]) words[4 * (row + hi) + lane % 4] = static_cast<uint16_t>(gates.y);
      }
    }
  };

  int stage = 0;  // tile % kStages
  for (int64_t tile = 0; tile < tiles; ++tile) {
    cp_async_wait<kAhead - 1>();  // this tile has landed (one commit group per tile)
    fence_async_shared();         // cp.async wrote it; wgmma reads it
    __syncthreads();              // for every thread; and the products of tile - 1 are done
    // Into the stage tile - 1 used.
    const int load_stage = stage == 0 ? SelectTraits::kStages - 1 : stage - 1;
    if (tile + kAhead < tiles) key_stream.load(tile + kAhead, load_stage);
    cp_async_commit();
    const int64_t base = tile * Traits::kKeysPerTile;
    // fp8: this lane's key's scale, loaded while the tensor cores work.
    float key_scale = 1.f;
    if constexpr (Traits::kFp8) {
      const int64_t key = base + tile_key;
      if (tile_key >= 0 && key < p.num_array_keys) key_scale = p.key_scales[key * p.key_stride];
    }
    const __nv_bfloat16* key_tile = key_tiles + stage * Traits::kKeyTileElems;
    stage = stage + 1 == SelectTraits::kStages ? 0 : stage + 1;
    float acc_lo[kHalf * Traits::kHeads / 2], acc_hi[kHalf * Traits::kHeads / 2];
    issue(key_tile, 0, acc_lo);
    issue(key_tile, kHalf, acc_hi);
    // The gates' bits where a table keeps them (a uniform branch).
    auto gates = [&](auto query, const auto& acc) {
      if constexpr (kMode == ScoreMode::kTable) {
        if (p.gates) return gate_bits<Traits, decltype(query)::value>(acc);
      }
      return uint2{};
    };
    using Q0 = std::integral_constant<int, 0>;
    using Q1 = std::integral_constant<int, 1>;
    wgmma_wait<1>();  // the first half is done
    fence_accumulators(acc_lo);
    emit(0, base, reduce_heads<Traits, 0>(acc_lo, weights[0]), key_scale, gates(Q0{}, acc_lo));
    emit(1, base, reduce_heads<Traits, 1>(acc_lo, weights[1]), key_scale, gates(Q1{}, acc_lo));
    wgmma_wait<0>();
    fence_accumulators(acc_hi);
    emit(2, base, reduce_heads<Traits, 0>(acc_hi, weights[2]), key_scale, gates(Q0{}, acc_hi));
    emit(3, base, reduce_heads<Traits, 1>(acc_hi, weights[3]), key_scale, gates(Q1{}, acc_hi));
  }
  static_assert(kQueries == 4, "the epilogue above names four queries");
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (kMode == ScoreMode::kCandidates) {
    if (threadIdx.x < kQueries && first_slot + static_cast<int>(threadIdx.x) < p.rows.rows) {
      p.counts[first_slot + threadIdx.x] = found[threadIdx.x];
    }
  }
}

// The r-th largest of n scores (its ordered key), by block_radix_select over all of them.
__device__ __forceinline__ RadixSelection select_score(const float* scores, int n, int r,
                                                       RadixSelectShared& shared) {
  return block_radix_select(
      n, r,
      [&](int i, uint32_t& key) {
        key = ordered_key(scores[i]);
        return true;
      },
      shared);
}

// Per row: the threshold that about `target` of its visible keys reach, from its sample scores.
// Rows that see at most `keep_all` keys keep everything (-infinity).
__global__ void __launch_bounds__(kRadixSelectThreads)
    sample_threshold_kernel(const float* sample_scores, const int* sample_counts,
                            int sample_capacity, RowSet rows, int64_t q_offset,
                            int64_t tokens_per_key, int64_t num_keys, int64_t keep_all,
                            int64_t target, float* thresholds) {
  __shared__ RadixSelectShared shared;
  const int slot = blockIdx.x;
  const int64_t visible = visible_keys(rows.row(slot), q_offset, tokens_per_key, num_keys);
  if (visible <= keep_all) {
    if (threadIdx.x == 0) thresholds[slot] = kNegInf;
    return;
  }
  const int n = min(sample_counts[slot], sample_capacity);
  const int64_t wanted = ceil_div(target * n, visible);
  const int r = static_cast<int>(wanted < 1 ? 1 : (wanted > n ? n : wanted));
  const float* scores = sample_scores + static_cast<int64_t>(slot) * sample_capacity;
  const RadixSelection sel = select_score(scores, n, r, shared);
  if (threadIdx.x == 0) thresholds[slot] = from_ordered_key(sel.key);
}

struct FinishParams {
  const float* cand_scores;
  const int* cand_keys;
  const int* counts;
  int capacity;
  RowSet rows;
  int64_t q_offset;
  int64_t tokens_per_key;
  int64_t num_keys;
  int topk;
  int sort_size;  // power of two >= topk
  int32_t* indices;
  float* scores;
  int* failed_rows;  // null: rows cannot fail (full-row buffers)
  int* failed_count;
};

// Per row: exact top-k of its candidates, in ascending key order.
__global__ void __launch_bounds__(kRadixSelectThreads) finish_rows_kernel(FinishParams p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* sorted = reinterpret_cast<unsigned long long*>(smem_raw);
  __shared__ RadixSelectShared shared;
  __shared__ int filled;

  const int slot = blockIdx.x;
  const int64_t row = p.rows.row(slot);
  const int64_t visible = visible_keys(row, p.q_offset, p.tokens_per_key, p.num_keys);
  const int want = static_cast<int>(visible < p.topk ? visible : p.topk);
  const int count = p.counts[slot];
  const int n = min(count, p.capacity);
  if (count > p.capacity || n < want) {
    // The threshold was too low (buffer overflowed) or too high (too few candidates).
    if (threadIdx.x == 0) p.failed_rows[atomicAdd(p.failed_count, 1)] = static_cast<int>(row);
    return;
  }
  const float* scores = p.cand_scores + static_cast<int64_t>(slot) * p.capacity;
  const int* keys = p.cand_keys + static_cast<int64_t>(slot) * p.capacity;
  if (want > 0) {
    const RadixSelection kth = select_score(scores, n, want, shared);
    // Ties at the k-th score: keep the smallest keys among those equal to it.
    const int needed = want - kth.greater;
    uint32_t last_key = 0xffffffffu;
    if (kth.equal > needed) {
      const RadixSelection cut = block_radix_select(
          n, needed,
          [&](int i, uint32_t& key) {
            key = ~static_cast<uint32_t>(keys[i]);
            return ordered_key(scores[i]) == kth.key;
          },
          shared);
      last_key = ~cut.key;
    }
    if (threadIdx.x == 0) filled = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t score_key = ordered_key(scores[i]);
      const uint32_t key = static_cast<uint32_t>(keys[i]);
      if (score_key > kth.key || (score_key == kth.key && key <= last_key)) {
        sorted[atomicAdd(&filled, 1)] = (static_cast<unsigned long long>(key) << 32) | score_key;
      }
    }
    __syncthreads();
    for (int i = want + threadIdx.x; i < p.sort_size; i += blockDim.x) sorted[i] = ~0ull;
    __syncthreads();
    if (p.sort_size == 2048) {  // the DSA k
      block_bitonic_sort_registers<2048 / kRadixSelectThreads>(sorted);
    } else {
      block_bitonic_sort(sorted, p.sort_size);
    }
  }
  int32_t* out_indices = p.indices + row * p.topk;
  float* out_scores = p.scores ? p.scores + row * p.topk : nullptr;
  for (int j = threadIdx.x; j < p.topk; j += blockDim.x) {
    const bool used = j < want;
    const unsigned long long entry = used ? sorted[j] : 0;
    out_indices[j] = used ? static_cast<int32_t>(entry >> 32) : -1;
    if (out_scores) {
      out_scores[j] = used ? from_ordered_key(static_cast<uint32_t>(entry & 0xffffffffu)) : kNegInf;
    }
  }
}

// keys[i * stride] -> sample[i]: the strided key sample the thresholds are estimated from.
__global__ void gather_key_sample_kernel(const uint4* keys, int64_t chunks_per_key, int64_t stride,
                                         int64_t sample_keys, uint4* sample) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < sample_keys * chunks_per_key;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t key = i / chunks_per_key, chunk = i % chunks_per_key;
    sample[i] = keys[key * stride * chunks_per_key + chunk];
  }
}

// The score table's entries the scoring leaves: each row's keys from its visible count on, and
// the padding to table_stride, as -infinity (a block a row; rows see prefixes, so that is a
// triangle, not the table).
__global__ void fill_unseen_kernel(float* table, int64_t table_stride, int64_t row_begin,
                                   int64_t q_offset, int64_t tokens_per_key, int64_t num_keys) {
  const int64_t row = blockIdx.x;
  float* const out = table + row * table_stride;
  for (int64_t key =
           visible_keys(row_begin + row, q_offset, tokens_per_key, num_keys) + threadIdx.x;
       key < table_stride; key += blockDim.x) {
    out[key] = kNegInf;
  }
}

// ---- Sizes of one call: chunking, buffers and the sampling stride --------------------------

constexpr int64_t kWorkspaceBudget = int64_t(2) << 30;  // bytes of scratch per chunk, about
constexpr int64_t kMinSample = 4096;                    // sample slots per row at least
constexpr int64_t kMaxSampleStride = 32;

struct Plan {
  int64_t capacity;         // candidate slots per row: 3 * topk
  int64_t target;           // candidates a threshold aims at: 2 * topk
  int64_t max_visible;      // keys the last row sees
  bool sample;              // false: every row keeps all visible keys (no threshold needed)
  int64_t stride;           // sampling stride
  int64_t sample_keys;      // keys in the sample
  int64_t sample_capacity;  // sample slots per row
  int64_t chunk_rows;
  int64_t fallback_rows;  // rows per fallback batch
  int64_t fallback_capacity;
  int sort_size;
};

int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

Plan make_plan(const IndexerShape& shape, int64_t topk) {
  Plan plan{};
  plan.capacity = round_up(3 * topk, 64);
  plan.target = 2 * topk;
  plan.max_visible = shape.num_queries > 0 ? shape.visible_keys(shape.num_queries - 1) : 0;
  plan.sample = plan.max_visible > plan.capacity;
  plan.sample_capacity = std::max(kMinSample, ceil_div(plan.max_visible, kMaxSampleStride));
  plan.stride = plan.sample ? ceil_div(plan.max_visible, plan.sample_capacity) : 1;
  plan.sample_keys = plan.sample ? ceil_div(shape.num_keys, plan.stride) : 0;
  const int64_t bytes_per_row = plan.capacity * 8 + (plan.sample ? plan.sample_capacity * 4 : 0) +
                                4 * 4;  // counts, sample counts, threshold, failed list
  plan.chunk_rows = std::max<int64_t>(
      SelectTraits::kQueriesPerBlock,
      std::min(round_up(std::max<int64_t>(shape.num_queries, 1), SelectTraits::kQueriesPerBlock),
               round_up(kWorkspaceBudget / bytes_per_row, SelectTraits::kQueriesPerBlock)));
  plan.fallback_capacity = round_up(std::max<int64_t>(shape.num_keys, 1), 64);
  plan.fallback_rows = std::max<int64_t>(
      SelectTraits::kQueriesPerBlock,
      std::min<int64_t>(plan.chunk_rows,
                        round_up(kWorkspaceBudget / 16 / (plan.fallback_capacity * 8),
                                 SelectTraits::kQueriesPerBlock)));
  plan.sort_size = 1;
  while (plan.sort_size < topk) plan.sort_size <<= 1;
  return plan;
}

// Where a scoring pass writes its candidates and the finishing pass reads them: the main pass's
// buffers or the fallback's.
struct CandidateBuffers {
  float* scores;
  int* keys;
  int* counts;
  int64_t capacity;

  template <class Params>  // ScoreParams or FinishParams
  Params applied_to(Params p) const {
    p.cand_scores = scores;
    p.cand_keys = keys;
    p.counts = counts;
    p.capacity = static_cast<int>(capacity);
    return p;
  }
};

// Carves the workspace into the buffers of a Plan (same layout for sizing and for use).
struct Workspace {
  float* cand_scores;
  int* cand_keys;
  int* counts;
  float* sample_scores;
  int* sample_counts;
  float* thresholds;
  int* failed_rows;
  int* failed_count;
  float* fallback_scores;
  int* fallback_keys;
  int* fallback_counts;
  __nv_bfloat16* sample_keys;
  size_t bytes;

  Workspace(const Plan& plan, int64_t dim, unsigned char* base) {
    size_t offset = 0;
    auto take = [&](size_t size) {
      unsigned char* at = base ? base + offset : nullptr;
      offset += (size + 255) / 256 * 256;
      return at;
    };
    const int64_t rows = plan.chunk_rows;
    cand_scores = reinterpret_cast<float*>(take(rows * plan.capacity * 4));
    cand_keys = reinterpret_cast<int*>(take(rows * plan.capacity * 4));
    counts = reinterpret_cast<int*>(take(rows * 4));
    sample_scores =
        reinterpret_cast<float*>(take(plan.sample ? rows * plan.sample_capacity * 4 : 0));
    sample_counts = reinterpret_cast<int*>(take(rows * 4));
    thresholds = reinterpret_cast<float*>(take(rows * 4));
    failed_rows = reinterpret_cast<int*>(take(rows * 4));
    failed_count = reinterpret_cast<int*>(take(4));
    fallback_scores =
        reinterpret_cast<float*>(take(plan.fallback_rows * plan.fallback_capacity * 4));
    fallback_keys = reinterpret_cast<int*>(take(plan.fallback_rows * plan.fallback_capacity * 4));
    fallback_counts = reinterpret_cast<int*>(take(plan.fallback_rows * 4));
    sample_keys = reinterpret_cast<__nv_bfloat16*>(take(plan.sample_keys * dim * 2));
    bytes = offset;
  }
};

template <class Traits, ScoreMode kMode>
void launch_score(const ScoreParams& p, cudaStream_t stream) {
  if (p.rows.rows == 0) return;
  constexpr size_t kSmem = (SelectTraits::kQueriesPerBlock * Traits::kQueryElems +
                            SelectTraits::kStages * Traits::kKeyTileElems) *
                               sizeof(__nv_bfloat16) +
                           SelectTraits::kQueriesPerBlock * sizeof(int);  // candidate counts
  auto kernel = score_rows_kernel<Traits, kMode>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
        "shared memory size");
  const int blocks = static_cast<int>(ceil_div(p.rows.rows, SelectTraits::kQueriesPerBlock));
  kernel<<<blocks, SelectTraits::kThreads, kSmem, stream>>>(p);
  check(cudaGetLastError(), "score kernel launch");
}

void launch_finish(const FinishParams& p, cudaStream_t stream) {
  if (p.rows.rows == 0) return;
  const size_t smem = size_t(p.sort_size) * sizeof(unsigned long long);
  check(cudaFuncSetAttribute(finish_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "shared memory size");
  finish_rows_kernel<<<p.rows.rows, kRadixSelectThreads, smem, stream>>>(p);
  check(cudaGetLastError(), "finish kernel launch");
}

template <class Traits>
FlashTopkStats flash_topk_impl(const IndexerShape& shape, const IndexerOperands& in, int64_t topk,
                               int32_t* indices, float* scores, void* workspace,
                               cudaStream_t stream) {
  const Plan plan = make_plan(shape, topk);
  Workspace ws(plan, shape.dim, static_cast<unsigned char*>(workspace));
  if (plan.sample) {
    const int64_t chunks = shape.dim * sizeof(typename Traits::Element) / 16;
    gather_key_sample_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(in.k), chunks,
                                                       plan.stride, plan.sample_keys,
                                                       reinterpret_cast<uint4*>(ws.sample_keys));
    check(cudaGetLastError(), "sample gather launch");
  }
  ScoreParams base{};
  base.q = in.q;
  base.w = in.w;
  base.key_scales = in.key_scales;
  base.q_offset = shape.q_offset;
  base.tokens_per_key = shape.visibility.tokens_per_key;
  base.num_keys = shape.num_keys;

  FinishParams finish{};
  finish.q_offset = shape.q_offset;
  finish.tokens_per_key = shape.visibility.tokens_per_key;
  finish.num_keys = shape.num_keys;
  finish.topk = static_cast<int>(topk);
  finish.sort_size = plan.sort_size;
  finish.indices = indices;
  finish.scores = scores;

  FlashTopkStats stats;
  for (int64_t row0 = 0; row0 < shape.num_queries; row0 += plan.chunk_rows) {
    const RowSet rows{row0, static_cast<int>(std::min(plan.chunk_rows, shape.num_queries - row0)),
                      nullptr};
    if (plan.sample) {
      ScoreParams sample = base;
      sample.keys = ws.sample_keys;
      sample.rows = rows;
      sample.key_stride = plan.stride;
      sample.num_array_keys = plan.sample_keys;
      sample.capacity = static_cast<int>(plan.sample_capacity);
      sample.cand_scores = ws.sample_scores;
      sample.counts = ws.sample_counts;
      launch_score<Traits, ScoreMode::kCandidates>(sample, stream);
      sample_threshold_kernel<<<rows.rows, kRadixSelectThreads, 0, stream>>>(
          ws.sample_scores, ws.sample_counts, static_cast<int>(plan.sample_capacity), rows,
          shape.q_offset, shape.visibility.tokens_per_key, shape.num_keys, plan.capacity,
          plan.target, ws.thresholds);
      check(cudaGetLastError(), "threshold kernel launch");
    }
    const CandidateBuffers candidates{ws.cand_scores, ws.cand_keys, ws.counts, plan.capacity};
    ScoreParams main = candidates.applied_to(base);
    main.keys = in.k;
    main.rows = rows;
    main.key_stride = 1;
    main.num_array_keys = shape.num_keys;
    main.thresholds = plan.sample ? ws.thresholds : nullptr;
    launch_score<Traits, ScoreMode::kCandidates>(main, stream);

    check(cudaMemsetAsync(ws.failed_count, 0, sizeof(int), stream), "memset");
    FinishParams chunk = candidates.applied_to(finish);
    chunk.rows = rows;
    chunk.failed_rows = ws.failed_rows;
    chunk.failed_count = ws.failed_count;
    launch_finish(chunk, stream);

    int failed = 0;
    check(cudaMemcpyAsync(&failed, ws.failed_count, sizeof(int), cudaMemcpyDeviceToHost, stream),
          "copy of the fallback count");
    check(cudaStreamSynchronize(stream), "synchronize");
    stats.fallback_rows += failed;
    const CandidateBuffers fallback{ws.fallback_scores, ws.fallback_keys, ws.fallback_counts,
                                    plan.fallback_capacity};
    for (int done = 0; done < failed; done += static_cast<int>(plan.fallback_rows)) {
      const RowSet listed{0, static_cast<int>(std::min<int64_t>(plan.fallback_rows, failed - done)),
                          ws.failed_rows + done};
      ScoreParams full = fallback.applied_to(main);
      full.rows = listed;
      full.thresholds = nullptr;
      launch_score<Traits, ScoreMode::kCandidates>(full, stream);
      FinishParams exact = fallback.applied_to(finish);
      exact.rows = listed;
      launch_finish(exact, stream);
    }
  }
  return stats;
}

// ---- index_score_gather ---------------------------------------------------------------------

// One warpgroup per query row: gathers 64 selected keys at a time into shared memory (two
// stages) and scores them with the same routine as the selection.
template <class Traits>
__global__ void __launch_bounds__(128)
    gather_scores_kernel(const __nv_bfloat16* q, const __nv_bfloat16* keys, const float* w,
                         const int32_t* indices, int64_t topk, int64_t num_keys, float* scores) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* query = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* key_tiles = query + Traits::kQueryElems;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const int32_t* row_indices = indices + row * topk;

  load_rows_async<Traits::kRowUnits, Traits::kHeads>(
      query, 0, Traits::kHeads, threadIdx.x, 128,
      [&](int h) { return row_units<Traits>(q, row * Traits::kHeads + h); });
  float weights[Traits::kHeadsPerLane];
  load_lane_weights<Traits>(w + row * Traits::kHeads, lane, weights);

  auto key_at = [&](int64_t j) -> int64_t {
    const int64_t key = j < topk ? row_indices[j] : -1;
    return key >= 0 && key < num_keys ? key : -1;
  };
  const int64_t tiles = ceil_div(topk, Traits::kKeysPerTile);
  auto load_tile = [&](int64_t tile) {
    load_rows_async<Traits::kRowUnits, Traits::kKeysPerTile>(
        key_tiles + (tile % 2) * Traits::kKeyTileElems, 0, Traits::kKeysPerTile, threadIdx.x, 128,
        [&](int r) -> const __nv_bfloat16* {
          const int64_t key = key_at(tile * Traits::kKeysPerTile + r);
          return key >= 0 ? row_units<Traits>(keys, key) : nullptr;
        });
  };
  load_tile(0);
  cp_async_commit();  // with the query
  const int tile_key = emitted_key(warp, lane);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) load_tile(tile + 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_async_shared();
    __syncthreads();
    float acc[Traits::kHeads / 2];
    wgmma_fence();
    issue_key_tile<Traits, 1, Traits::kHeads>(key_tiles + (tile % 2) * Traits::kKeyTileElems, query,
                                              0, acc);
    wgmma_commit();
    wgmma_wait<0>();
    const float2 s = reduce_heads<Traits, 0>(acc, weights);
    const int64_t j = tile * Traits::kKeysPerTile + tile_key;
    if (tile_key >= 0 && j < topk) {
      scores[row * topk + j] = key_at(j) >= 0 ? (lane % 4 == 0 ? s.x : s.y) : kNegInf;
    }
    __syncthreads();  // the next load overwrites this stage
  }
}

// ---- Dispatch over the compiled (heads, dim) -------------------------------------------------

template <class Element = __nv_bfloat16, class Fn>
void dispatch_shape(int64_t heads, int64_t dim, Fn&& fn) {
  auto with_dim = [&](auto heads_constant) {
    constexpr int kHeads = decltype(heads_constant)::value;
    if (dim == 128) return fn(IndexTileTraits<kHeads, 128, Element>{});
    if (dim == 64) return fn(IndexTileTraits<kHeads, 64, Element>{});
    throw std::invalid_argument("hyscale CUDA indexer: d_I must be 64 or 128, got " +
                                std::to_string(dim));
  };
  if (heads == 64) return with_dim(std::integral_constant<int, 64>{});
  if (heads == 32) return with_dim(std::integral_constant<int, 32>{});
  if (heads == 16) return with_dim(std::integral_constant<int, 16>{});
  throw std::invalid_argument("hyscale CUDA indexer: H_I must be 16, 32 or 64, got " +
                              std::to_string(heads));
}

}  // namespace

size_t flash_topk_workspace_bytes(const IndexerShape& shape, int64_t topk) {
  return Workspace(make_plan(shape, topk), shape.dim, nullptr).bytes;
}

FlashTopkStats flash_topk(const IndexerShape& shape, const IndexerOperands& in, int64_t topk,
                          int32_t* indices, float* scores, void* workspace, Stream stream) {
  if (topk < 1 || topk > kMaxTopk) {
    throw std::invalid_argument("hyscale::flash_topk (CUDA): topk must be in [1, " +
                                std::to_string(kMaxTopk) + "], got " + std::to_string(topk));
  }
  if (shape.num_queries == 0) return {};
  FlashTopkStats stats;
  auto run = [&](auto traits) {
    stats = flash_topk_impl<decltype(traits)>(shape, in, topk, indices, scores, workspace,
                                              static_cast<cudaStream_t>(stream));
  };
  if (in.fp8()) {
    dispatch_shape<__nv_fp8_e4m3>(shape.heads, shape.dim, run);
  } else {
    dispatch_shape(shape.heads, shape.dim, run);
  }
  return stats;
}

void index_score_gather(const IndexerShape& shape, const void* q, const void* k, const float* w,
                        const int32_t* indices, int64_t topk, float* scores, Stream stream) {
  if (shape.num_queries == 0 || topk == 0) return;
  dispatch_shape(shape.heads, shape.dim, [&](auto traits) {
    using Traits = decltype(traits);
    constexpr size_t kSmem =
        (Traits::kQueryElems + 2 * Traits::kKeyTileElems) * sizeof(__nv_bfloat16);
    auto kernel = gather_scores_kernel<Traits>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
          "shared memory size");
    kernel<<<static_cast<unsigned>(shape.num_queries), 128, kSmem,
             static_cast<cudaStream_t>(stream)>>>(static_cast<const __nv_bfloat16*>(q),
                                                  static_cast<const __nv_bfloat16*>(k), w, indices,
                                                  topk, shape.num_keys, scores);
    check(cudaGetLastError(), "gather kernel launch");
  });
}

void index_score_table(const IndexerShape& shape, const void* q, const void* k, const float* w,
                       int64_t row_begin, int64_t rows, float* table, uint64_t* gates,
                       int64_t table_stride, Stream stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (rows == 0) return;
  fill_unseen_kernel<<<static_cast<unsigned>(rows), 256, 0, cuda_stream>>>(
      table, table_stride, row_begin, shape.q_offset, shape.visibility.tokens_per_key,
      shape.num_keys);
  check(cudaGetLastError(), "fill launch");
  dispatch_shape(shape.heads, shape.dim, [&](auto traits) {
    ScoreParams p{};
    p.q = static_cast<const __nv_bfloat16*>(q);
    p.keys = static_cast<const __nv_bfloat16*>(k);
    p.w = w;
    p.rows = RowSet{row_begin, static_cast<int>(rows), nullptr};
    p.q_offset = shape.q_offset;
    p.tokens_per_key = shape.visibility.tokens_per_key;
    p.num_keys = shape.num_keys;
    p.key_stride = 1;
    p.num_array_keys = shape.num_keys;
    p.table = table;
    p.table_stride = table_stride;
    p.gates = gates;
    launch_score<decltype(traits), ScoreMode::kTable>(p, cuda_stream);
  });
}

}  // namespace hyscale::cuda
