// Forward with values inside the keys, warp-specialized (SparseAttnLatentTraits). Per pair of
// 64-key blocks (b0 = 2i in buffer 0, b1 = 2i + 1 in buffer 1), with M the running row
// references (below) that both consumers share:
//   warpgroup 0: M0 = raised_max(M, rowmax S0), published before P0 of S0 against it; O_left +=
//     P0 V0 (P0 from registers); once warpgroup 1 has published M1, rescales O_left and P0 to M1
//     (if a row of the warp moved), stores P0 for warpgroup 1 and adds O_left += P1 V1 while S of
//     the next pair's b0 runs;
//   warpgroup 1: M1 = raised_max(M0, rowmax S1), published before P1 of S1 against it; O_right +=
//     P1 V1 (from registers), stores P1, O_right += P0 V0.
// So at the end of every pair both consumers' accumulators and sums are relative to the same
// references; each sums P over its own blocks, and the two sums meet at the end.
#pragma once

#include "kernels/cuda/sparse_attn/fwd_common.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"
#include "kernels/cuda/warp_specialization.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace hyscale::cuda::attn {

// A row's reference is not its running maximum: it moves only when a block's maximum exceeds it
// by more than kMaxLag (log2 units). Its probabilities stay below 2^kMaxLag, which fp32 sums and
// bf16 P hold with room to spare, and after a row's first blocks its accumulators are almost
// never rescaled (a warp skips the multiplications when none of its rows moved: 128 a thread,
// twice a pair in warpgroup 0, on the path from S to P V). The sums and the LSE are taken
// against the same references, so the result is the same softmax.
constexpr float kMaxLag = 8.f;
__device__ __forceinline__ float raised_max(float reference, float block_max) {
  return block_max > reference + kMaxLag ? block_max : reference;
}
__device__ __forceinline__ bool warp_moved(float old_a, float new_a, float old_b, float new_b) {
  return __any_sync(0xffffffff, old_a != new_a || old_b != new_b);
}

// Shared memory after the tiles.
struct LatentSync {
  uint64_t q_ready[2];   // [half: 0 left, 1 right] of Q's column blocks, as the K buffers' halves
  uint64_t q_free;       // both consumers' last S of an item has read Q
  uint64_t ready[2][2];  // [buffer][half: 0 left, 1 right]: the producer's copies have landed
  uint64_t free[2][2];   // [buffer][half]: its last reader is done with it
  uint64_t valid_ready;  // the producer has written `valid` for the pair
  // [buffer][slot byte]: 1 where the block's key slot holds a key, at the byte a consumer thread
  // reads it from (latent_valid_byte): a thread's 16 slots are 16 contiguous bytes.
  alignas(16) uint8_t valid[2][64];
  float row_max[64];     // the running maxima, handed from one consumer to the other
  float row_sum[2][64];  // both consumers' final sums
};

// Where slot `slot` (< 64) of a block lies in LatentSync::valid: thread lane's score columns are
// 8 j + 2 (lane % 4) + e (j < 8, e < 2, the wgmma accumulator layout), at byte 16 (lane % 4) +
// 2 j + e, so one 16-byte load gives a thread all of its columns in bit order.
__device__ __forceinline__ int latent_valid_byte(int slot) {
  return 16 * (slot % 8 / 2) + 2 * (slot / 8) + slot % 2;
}

// Named barriers between the two consumer warpgroups.
enum LatentBarrier : int { kMax0Ready = 1, kMax1Ready, kP0Ready, kP1Ready, kSumsReady };

struct ConsumerBarrier {
  __device__ void operator()() const { named_barrier_sync(kSumsReady, 256); }
};

// An item's pairs of 64-key blocks (its slots up to the last valid one), and the block's next
// item after `item` that has any (>= items: none). Items without pairs (every slot -1) take no
// part in the pipeline; the consumers write their rows as empty.
template <int BK>
__device__ int pairs_of(const KeyList& list) {
  return static_cast<int>(ceil_div(ceil_div(list.count, BK), 2));
}
template <int BK>
__device__ int item_pairs(const Problem& p, int item) {
  return pairs_of<BK>(key_list(p, tile_of(p, item).grp));
}
template <int BK>
__device__ int next_busy_item(const Problem& p, int item, int items) {
  do {
    item += static_cast<int>(gridDim.x);
  } while (item < items && item_pairs<BK>(p, item) == 0);
  return item;
}

// The producer warpgroup: per item its Q, then per pair the four half buffers in the order their
// readers free them. The block is persistent: its items are blockIdx.x + i gridDim.x, and the
// producer runs on into the next item as buffers are freed (Q once both consumers' last S of an
// item has read it), so an item's first blocks land while the previous one's last run.
// Thread t copies the 16-byte chunk t % 8 of every 64-column block of rows t / 8 + 16 i, so its
// shared-memory offsets inside a block are constants (those rows agree mod 8: one swizzle).
template <class Tr>
__device__ void produce_latent_blocks(const Problem& p, bf16* sq, bf16* const (&kbuf)[2],
                                      LatentSync& sync, int items) {
  constexpr int DQ = Tr::kDimQk, BK = Tr::kKeys, kRowsPerThread = BK / 16;
  constexpr int L = Tr::kLeftBlocks, C = Tr::kColumnBlocks;
  const int t = threadIdx.x % 128, chunk = t % 8, row0 = t / 8;
  const uint64_t policy = l2_evict_last_policy();
  const int offset = row0 * 64 + (chunk ^ (row0 % 8)) * 8;  // = swizzled_offset<BK>(row0, chunk)
  // The slots of one pair of the block's items: a cursor that moves on a pair at a time and, past
  // an item's last pair, to the next busy item's first (no slots past the block's last item), so
  // an item's end costs one lookup and a pair a few additions.
  struct PairSlots {
    const int32_t* keys;
    int count;  // slots from keys on (<= 0: none)
    int pairs_left, item;
    __device__ int key(int slot) const { return slot < count ? keys[slot] : -1; }
  };
  auto start_item = [&](PairSlots& c, int item) {
    c.item = item;
    const KeyList list = item < items ? key_list(p, tile_of(p, item).grp) : KeyList{};
    c.keys = list.keys;
    c.count = list.count;
    c.pairs_left = pairs_of<BK>(list);
  };
  auto advance = [&](PairSlots& c) {
    if (--c.pairs_left > 0) {
      c.keys += 2 * BK;
      c.count -= 2 * BK;
    } else {
      start_item(c, next_busy_item<BK>(p, c.item, items));
    }
  };
  // Thread's rows of a pair: key[b][i] is row row0 + 16 i of block b (-1: none, zero-filled).
  using PairKeys = int[2][kRowsPerThread];
  auto load_keys = [&](const PairSlots& slots, PairKeys& keys) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) keys[b][i] = slots.key(b * BK + row0 + 16 * i);
    }
  };
  // Column blocks [first_block, end_block) of this thread's rows of a 64-row tile: row row0 + 16 i
  // from src(i) where valid(i), else zeros, under the L2 policy l2.
  auto copy_rows = [&](bf16* tile, auto src, auto valid, int first_block, int end_block,
                       uint64_t l2) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bf16* from = src(i);
#pragma unroll
      for (int cb = first_block; cb < end_block; ++cb) {
        cp_async_16_l2(tile + cb * BK * 64 + 16 * i * 64 + offset, from + cb * 64, valid(i), l2);
      }
    }
  };
  auto copy_half = [&](bf16* tile, const int(&keys)[kRowsPerThread], int first_block,
                       int end_block) {
    copy_rows(
        tile, [&](int i) { return p.key + int64_t(max(keys[i], 0)) * DQ + chunk * 8; },
        [&](int i) { return keys[i] >= 0; }, first_block, end_block, policy);
  };
  // An item's 64 Q rows are one contiguous range (G = 1, whole head blocks), copied like the
  // gathers' rows, so this thread's offsets are constants too.
  auto q_of = [&](int item) {
    const auto [grp, h0] = tile_of(p, item);
    return p.q + tile_row(p, grp, h0, 0) * DQ;
  };
  const uint64_t read_once = l2_evict_first_policy();
  auto copy_q_half = [&](const bf16* q_rows, int half) {
    copy_rows(
        sq, [&](int i) { return q_rows + int64_t(row0 + 16 * i) * DQ + chunk * 8; },
        [](int) { return true; }, half == 0 ? 0 : L, half == 0 ? L : C, read_once);
    cp_async_arrive(&sync.q_ready[half]);
  };
  // Indices are read a pair before their copies: the producer never waits for an index load
  // between a free buffer and its copy. Q comes in halves beside the K halves its products pair
  // with (Q left, buffer 0 left, Q right, buffer 1 right). The rows are not prefetched into L2:
  // the copies of the pair in flight hide the gathers' latency, and prefetches issued ahead of
  // them made the forward 3-4 % slower (docs/performance.md, section 7).
  const int first_item =
      next_busy_item<BK>(p, static_cast<int>(blockIdx.x) - static_cast<int>(gridDim.x), items);
  PairSlots ahead;
  start_item(ahead, first_item);
  PairKeys keys;
  load_keys(ahead, keys);
  advance(ahead);
  int round = 0;  // pairs so far, over all items: the barriers' phases
  // i counts the busy items (Q's phases).
  for (int i = 0, item = first_item; item < items; ++i, item = next_busy_item<BK>(p, item, items)) {
    const bf16* q_rows = q_of(item);
    const int pairs = item_pairs<BK>(p, item);
    mbarrier_wait(&sync.q_free, (i & 1) ^ 1);
    copy_q_half(q_rows, 0);
    for (int pair = 0; pair < pairs; ++pair, ++round) {
      PairKeys next;
      load_keys(ahead, next);
      advance(ahead);
      const uint32_t parity = (round & 1) ^ 1;  // the readers' previous round
      mbarrier_wait(&sync.free[0][0], parity);
      copy_half(kbuf[0], keys[0], 0, L);
      cp_async_arrive(&sync.ready[0][0]);
      if (pair == 0) copy_q_half(q_rows, 1);
      mbarrier_wait(&sync.free[1][1], parity);
      copy_half(kbuf[1], keys[1], L, C);
      cp_async_arrive(&sync.ready[1][1]);
      // Both consumers have masked the previous pair (each frees a half after it), so its
      // validity bytes can be replaced.
      if (chunk == 0) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#pragma unroll
          for (int r = 0; r < kRowsPerThread; ++r) {
            sync.valid[b][latent_valid_byte(row0 + 16 * r)] = keys[b][r] >= 0;
          }
        }
      }
      mbarrier_arrive(&sync.valid_ready);
      mbarrier_wait(&sync.free[0][1], parity);
      copy_half(kbuf[0], keys[0], L, C);
      cp_async_arrive(&sync.ready[0][1]);
      mbarrier_wait(&sync.free[1][0], parity);
      copy_half(kbuf[1], keys[1], 0, L);
      cp_async_arrive(&sync.ready[1][0]);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) keys[b][r] = next[b][r];
      }
    }
  }
}

// Consumer warpgroup kWg (the schedule above), over the block's items: per item its pairs of
// blocks (consume_pairs_wg0 or _wg1), then its rows' output. The running state is
// consume_latent_blocks' locals, held here by reference: as members of this struct it compiled
// to different code.
template <class Tr, int kWg>
struct LatentConsumer {
  static constexpr int DV = Tr::kDimV, BK = Tr::kKeys, kPvN = Tr::kPvN, kChunks = Tr::kPvChunks;
  static_assert(BK == 64, "LatentSync::valid holds 64-key blocks");
  static constexpr int L = Tr::kLeftBlocks, C = Tr::kColumnBlocks;
  static constexpr int kPairThreads = Tr::kConsumerThreads;
  static constexpr int kColumns = kWg * (DV / 2);  // this warpgroup's value columns
  const Problem& p;
  bf16* const sq;
  bf16* const (&kbuf)[2];
  bf16* const (&ptile)[2];  // where consumer c's P goes for the other
  LatentSync& sync;
  const int warp, lane, ra, rb;
  float &m_a, &m_b, &l_a, &l_b;
  float (&o)[kChunks][kPvN / 2];
  float (&s)[BK / 2];          // S, then P, of this warpgroup's block
  uint32_t (&pa)[BK / 16][4];  // P (bf16) as the A operands of the k16 steps of P V

  __device__ void consume(int items, const FwdOut& o_) {
    const int stride = static_cast<int>(gridDim.x);
    // Warpgroup 0: the validity bits of an item's first pair, and whether its S already ran
    // beside the previous item's end.
    uint32_t selected = 0;
    bool next_s_done = false;
    int round = 0;  // pairs so far, over all items: the barriers' phases
    // i counts the busy items (Q's phases).
    for (int i = 0, item = static_cast<int>(blockIdx.x); item < items; item += stride) {
      const int pairs = item_pairs<BK>(p, item);
      m_a = m_b = -INFINITY;
      l_a = l_b = 0.f;
      // The zeros of o stay before the first wgmma (inside its stage they would serialize it).
      clear_accumulators(o);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
      if constexpr (kWg == 0) {
        consume_pairs_wg0(item, items, pairs, i, round, next_s_done, selected);
      } else {
        consume_pairs_wg1(pairs, i, round);
      }

      // Without pairs (every slot -1) the rows saw nothing: no sums to exchange.
      const RowTotals totals =
          pairs > 0 ? row_totals(sync.row_sum, kWg, ra, rb, lane, l_a, l_b, ConsumerBarrier{})
                    : RowTotals{0.f, 0.f, 0.f, 0.f};
      const auto [grp, h0] = tile_of(p, item);
      const int64_t first_row = tile_row(p, grp, h0, 0);  // G = 1, whole head blocks: rows exist
      if (kWg == 0 && lane % 4 == 0) {
        write_lse(o_.lse, first_row + ra, m_a, totals.tot_a);
        write_lse(o_.lse, first_row + rb, m_b, totals.tot_b);
      }
      store_output(o_.out + (first_row + ra) * DV, o_.out + (first_row + rb) * DV, totals.inv_a,
                   totals.inv_b);
      round += pairs;
      i += pairs > 0;
    }
  }

  // Warpgroup 0's part of item `item` (the schedule above): its `pairs` pairs, with i the busy
  // items and round the pairs before it. next_s_done and selected carry on to the next item.
  __device__ void consume_pairs_wg0(int item, int items, int pairs, int i, int round,
                                    bool& next_s_done, uint32_t& selected) {
    const bool busy_after = next_busy_item<BK>(p, item, items) < items;
    // No wgmma is in flight across the loop's back edge or a merge of paths: ptxas serializes
    // a stage in which a non-wgmma instruction reads or defines an accumulator, register moves
    // at a merge included. So the loop leaves from its middle, and S of the next pair, issued
    // while P1 V1 runs, is waited for before the back edge. The next pair may be the next
    // item's first: its S then runs beside this item's last P1 V1, before the output.
    if (pairs > 0) {
      if (!next_s_done) {
        mbarrier_wait(&sync.q_ready[0], i & 1);
        issue_s_half(round, 0, true);
        mbarrier_wait(&sync.q_ready[1], i & 1);
        issue_s_half(round, 1, false);
        selected = selected_columns(round);
        wgmma_wait<0>();
        fence_accumulators(s);
      }
      for (int pair = 0;; ++pair) {
        const bool last = pair + 1 == pairs;
        if (last) mbarrier_arrive(&sync.q_free);  // its last S has read Q
        float mx_a, mx_b;
        mask_scores(selected, mx_a, mx_b);
        const float m0_a = raised_max(m_a, mx_a), m0_b = raised_max(m_b, mx_b);
        publish_max(m0_a, m0_b);
        named_barrier_arrive(kMax0Ready, kPairThreads);
        softmax(m0_a, m0_b);
        pv_own(0);
        wgmma_wait<0>();
        retire_pv();
        mbarrier_arrive(&sync.free[0][0]);
        named_barrier_sync(kMax1Ready, kPairThreads);
        const float m1_a = sync.row_max[ra], m1_b = sync.row_max[rb];
        const bool moved = warp_moved(m_a, m1_a, m_b, m1_b);
        const float c_a = rescale_factor(m_a, m1_a), c_b = rescale_factor(m_b, m1_b);
        m_a = m1_a;
        m_b = m1_b;
        if (moved) rescale_p(c_a, c_b);
        store_p();
        named_barrier_arrive(kP0Ready, kPairThreads);
        l_a *= c_a;
        l_b *= c_b;
        if (moved) scale_rows(o, c_a, c_b);
        named_barrier_sync(kP1Ready, kPairThreads);
        if (last && !busy_after) {
          pv_other(1);
          wgmma_wait<0>();
          mbarrier_arrive(&sync.free[1][0]);
          next_s_done = false;
          break;
        }
        pv_other(1);
        if (last) mbarrier_wait(&sync.q_ready[0], (i + 1) & 1);
        issue_s_half(round + pair + 1, 0, true);
        wgmma_wait<1>();  // P1 V1: buffer 1's left half is free before S waits for the right
        mbarrier_arrive(&sync.free[1][0]);
        if (last) mbarrier_wait(&sync.q_ready[1], (i + 1) & 1);
        issue_s_half(round + pair + 1, 1, false);
        selected = selected_columns(round + pair + 1);
        wgmma_wait<0>();
        fence_accumulators(s);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
        if (last) {
          next_s_done = true;
          break;
        }
      }
    }
  }

  // Warpgroup 1's part of an item of `pairs` pairs (i and round as above).
  __device__ void consume_pairs_wg1(int pairs, int i, int round) {
    if (pairs > 0) {
      mbarrier_wait(&sync.q_ready[0], i & 1);
      mbarrier_wait(&sync.q_ready[1], i & 1);
    }
    for (int pair = 0; pair < pairs; ++pair) {
      issue_s_half(round + pair, 1, true);
      issue_s_half(round + pair, 0, false);
      const uint32_t selected = selected_columns(round + pair);
      wgmma_wait<0>();
      fence_accumulators(s);
      if (pair + 1 == pairs) mbarrier_arrive(&sync.q_free);
      float mx_a, mx_b;
      mask_scores(selected, mx_a, mx_b);
      named_barrier_sync(kMax0Ready, kPairThreads);
      const float m1_a = raised_max(sync.row_max[ra], mx_a);
      const float m1_b = raised_max(sync.row_max[rb], mx_b);
      __syncwarp();  // every lane has read M0 before its row's lane 0 overwrites it
      publish_max(m1_a, m1_b);
      named_barrier_arrive(kMax1Ready, kPairThreads);
      softmax(m1_a, m1_b);
      pv_own(1);
      store_p();
      named_barrier_sync(kP0Ready, kPairThreads);
      pv_other(0);
      named_barrier_arrive(kP1Ready, kPairThreads);
      wgmma_wait<1>();  // the own P V (fences after the last wait, as in warpgroup 0)
      mbarrier_arrive(&sync.free[1][1]);
      wgmma_wait<0>();
      retire_pv();
      mbarrier_arrive(&sync.free[0][1]);
    }
  }

  // S of this warpgroup's block of `pair`, one half of the K buffer (0 left, 1 right) at a time,
  // each its own commit group: the half this warpgroup frees first is filled first, and the
  // first half's product runs while the second is still landing.
  __device__ void issue_s_half(int pair, int half, bool overwrite) {
    const uint64_t q0 = descriptor_here(matrix_descriptor<64>(sq, 0, 0));
    const uint64_t k0 = descriptor_here(matrix_descriptor<BK>(kbuf[kWg], 0, 0));
    mbarrier_wait(&sync.ready[kWg][half], pair & 1);
    fence_async_shared();
    // (No compiler fence on s here: for warpgroup 0 this is inside the P V's pipeline stage, and
    // ptxas serializes the stage when a non-wgmma instruction defines an accumulator in it.)
    wgmma_fence();
    const int first = half == 0 ? 0 : L, end = half == 0 ? L : C;
#pragma unroll
    for (int ks = first * 4; ks < end * 4; ++ks) {
      Wgmma<BK>::run(s, advance_descriptor<64>(q0, ks), advance_descriptor<BK>(k0, ks),
                     !(overwrite && ks == first * 4));
    }
    wgmma_commit();
  }
  // Which of this thread's 16 score columns of the pair's block in its buffer its query
  // selected (bit 2 j + e: column 8 j + 2 (lane % 4) + e), from the bytes the producer wrote.
  __device__ uint32_t selected_columns(int pair) {
    mbarrier_wait(&sync.valid_ready, pair & 1);
    const uint4 bytes = *reinterpret_cast<const uint4*>(&sync.valid[kWg][16 * (lane % 4)]);
    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < 16; ++k) bits |= ((words[k / 4] >> (8 * (k % 4))) & 1u) << k;
    return bits;
  }
  // Masks S (finished) by `selected` and takes it to log2 units; gives its row maxima.
  __device__ void mask_scores(uint32_t selected, float& mx_a, float& mx_b) {
    mx_a = -INFINITY;
    mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      const bool seen = (selected >> (2 * (i / 4) + i % 2)) & 1;
      s[i] = seen ? s[i] * p.scale_log2 : -INFINITY;
      if (i % 4 < 2) {
        mx_a = fmaxf(mx_a, s[i]);
      } else {
        mx_b = fmaxf(mx_b, s[i]);
      }
    }
    mx_a = quad_max(mx_a);
    mx_b = quad_max(mx_b);
  }
  // P against the new maxima (0 while a row has seen nothing); O and the sums follow them.
  __device__ void softmax(float new_a, float new_b) {
    const float alpha_a = rescale_factor(m_a, new_a), alpha_b = rescale_factor(m_b, new_b);
    const float base_a = softmax_base(new_a), base_b = softmax_base(new_b);
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) {
      s[i] = exp2_ftz(s[i] - (i % 4 < 2 ? base_a : base_b));
      if (i % 4 < 2) {
        sum_a += s[i];
      } else {
        sum_b += s[i];
      }
    }
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[ks][r] = pack_bf16(s[8 * ks + 2 * r], s[8 * ks + 2 * r + 1]);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    if (warp_moved(m_a, new_a, m_b, new_b)) scale_rows(o, alpha_a, alpha_b);
    m_a = new_a;
    m_b = new_b;
  }
  // The new maxima for the other consumer, before this one's exponentials: its softmax need not
  // wait for them.
  __device__ void publish_max(float new_a, float new_b) {
    if (lane % 4 == 0) {
      sync.row_max[ra] = new_a;
      sync.row_max[rb] = new_b;
    }
  }
  // pa again from P times per-row factors (once the own P V has read it).
  __device__ void rescale_p(float c_a, float c_b) {
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float c = r % 2 == 0 ? c_a : c_b;
        pa[ks][r] = pack_bf16(s[8 * ks + 2 * r] * c, s[8 * ks + 2 * r + 1] * c);
      }
    }
  }
  // pa into this warpgroup's P tile for the other one, one stmatrix a k16 step: pa[ks][m] is the
  // 8 x 8 matrix of rows 16 warp + 8 (m % 2) .., columns 16 ks + 8 (m / 2) .., and lane gives
  // row lane % 8 of matrix lane / 8.
  __device__ void store_p() {
    const int m = lane / 8, row = warp * 16 + (m % 2) * 8 + lane % 8;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      stmatrix_x4(ptile[kWg] + swizzled_offset<64>(row, 2 * ks + m / 2), pa[ks]);
    }
    fence_async_shared();  // read by the other warpgroup's wgmma
  }
  // O += P V over buffer `buffer`'s rows and this warpgroup's value columns: P from registers
  // (own) or from the other warpgroup's tile.
  __device__ void pv_own(int buffer) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
    wgmma_fence();
    const uint64_t v0 = descriptor_here(mn_major_descriptor<BK>(kbuf[buffer], kColumns, 0));
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        WgmmaRegA<kPvN, 1>::run(o[c], pa[ks], advance_mn_major<BK>(v0, c * kPvN, ks * 16));
      }
    }
    wgmma_commit();
  }
  __device__ void pv_other(int buffer) {
    wgmma_fence();
    const uint64_t p0 = descriptor_here(matrix_descriptor<64>(ptile[1 - kWg], 0, 0));
    const uint64_t v0 = descriptor_here(mn_major_descriptor<BK>(kbuf[buffer], kColumns, 0));
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        Wgmma<kPvN, 1>::run(o[c], advance_descriptor<64>(p0, ks),
                            advance_mn_major<BK>(v0, c * kPvN, ks * 16), 1);
      }
    }
    wgmma_commit();
  }
  __device__ void retire_pv() {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fence_accumulators(o[c]);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) fence_operands(pa[ks]);
  }
  // The item's output, straight from the accumulators (Q's tile, which staged it before, is
  // already loading the next item's Q): per 32 columns of a row the four lanes of a quad hold
  // 2 columns of each 8, and after a 4 x 4 transpose of those words across the quad (two
  // exchanges) each lane holds 8 adjacent columns, one 16-byte store.
  __device__ void store_output(bf16* out_a, bf16* out_b, float inv_a, float inv_b) {
    const bool hi = lane & 2, odd = lane & 1;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int g = 0; g < kPvN / 32; ++g) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float inv = r == 0 ? inv_a : inv_b;
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float* x = &o[c][16 * g + 4 * j + 2 * r];
            w[j] = pack_bf16(x[0] * inv, x[1] * inv);
          }
          // Word j of lane q is kColumns 8 j + 2 q ..; afterwards word j is kColumns 8 q + 2 j ..
          uint32_t x0 = __shfl_xor_sync(0xffffffff, hi ? w[0] : w[2], 2);
          uint32_t x1 = __shfl_xor_sync(0xffffffff, hi ? w[1] : w[3], 2);
          if (hi) {
            w[0] = x0, w[1] = x1;
          } else {
            w[2] = x0, w[3] = x1;
          }
          x0 = __shfl_xor_sync(0xffffffff, odd ? w[0] : w[1], 1);
          x1 = __shfl_xor_sync(0xffffffff, odd ? w[2] : w[3], 1);
          if (odd) {
            w[0] = x0, w[2] = x1;
          } else {
            w[1] = x0, w[3] = x1;
          }
          bf16* row = r == 0 ? out_a : out_b;
          *reinterpret_cast<uint4*>(row + kColumns + c * kPvN + 32 * g + 8 * (lane % 4)) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
};

// Consumer warpgroup kWg over the block's items. ptile[c] is where consumer c's P goes for the
// other.
template <class Tr, int kWg>
__device__ void consume_latent_blocks(const Problem& p, bf16* sq, bf16* const (&kbuf)[2],
                                      bf16* const (&ptile)[2], LatentSync& sync, int items,
                                      const FwdOut& o_) {
  using Consumer = LatentConsumer<Tr, kWg>;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int ra = warp * 16 + lane / 4, rb = ra + 8;
  float m_a, m_b, l_a, l_b;
  float o[Consumer::kChunks][Consumer::kPvN / 2];
  float s[Consumer::BK / 2];
  uint32_t pa[Consumer::BK / 16][4];
  Consumer{p, sq, kbuf, ptile, sync, warp, lane, ra, rb, m_a, m_b, l_a, l_b, o, s, pa}.consume(
      items, o_);
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    sparse_attn_fwd_latent_kernel(Problem p, FwdOut o_) {
  static_assert(sizeof(LatentSync) <= Tr::kSmemBytes - Tr::kTilesBytes);
  extern __shared__ __align__(1024) unsigned char tiles_raw[];
  bf16* sq = reinterpret_cast<bf16*>(tiles_raw);
  bf16* const kbuf[2] = {reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes),
                         reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + Tr::kKBytes)};
  bf16* p_tiles = reinterpret_cast<bf16*>(tiles_raw + Tr::kQBytes + 2 * Tr::kKBytes);
  bf16* const ptile[2] = {Tr::kPInKeyTail ? kbuf[0] + (Tr::kColumnBlocks - 1) * Tr::kKeys * 64
                                          : p_tiles + Tr::kPBytes / 2,
                          p_tiles};
  auto& sync = *reinterpret_cast<LatentSync*>(tiles_raw + Tr::kTilesBytes);
  const int wg = warpgroup_index();
  const int items = p.n * ((p.heads + p.hb - 1) / p.hb);
  if (threadIdx.x == 0) {
    for (int half = 0; half < 2; ++half) mbarrier_init(&sync.q_ready[half], 128);
    mbarrier_init(&sync.q_free, 256);
    for (int b = 0; b < 2; ++b) {
      for (int half = 0; half < 2; ++half) {
        mbarrier_init(&sync.ready[b][half], 128);
        mbarrier_init(&sync.free[b][half], 128);
      }
    }
    mbarrier_init(&sync.valid_ready, 128);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (wg == 2) {
    release_registers<Tr::kProducerRegisters>();
    produce_latent_blocks<Tr>(p, sq, kbuf, sync, items);
  } else {
    claim_registers<Tr::kConsumerRegisters>();
    if (wg == 0) {
      consume_latent_blocks<Tr, 0>(p, sq, kbuf, ptile, sync, items, o_);
    } else {
      consume_latent_blocks<Tr, 1>(p, sq, kbuf, ptile, sync, items, o_);
    }
  }
}

}  // namespace hyscale::cuda::attn
