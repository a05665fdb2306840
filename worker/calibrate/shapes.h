// The shapes hyscale-calibrate measures at: the DSA layer of DESIGN.md (H = 128, d_qk = 576,
// d_v = 512, H_I = 64, d_I = 128, k = 2048) at lengths that take seconds, not minutes.
#pragma once

#include <cstdint>

#include "hyscale/v1/calibration.pb.h"

namespace hyscale::calibrate {

struct Shapes {
  // N of sparse attention, the gather baseline and the indexer loss (rates flat in N: k a query).
  int64_t seq_len = 0;
  // N of FlashTopK and the score table: their rates grow with N (fixed costs amortise), and the
  // planner uses them at long N, so they are measured longer where that is cheap.
  int64_t selection_seq_len = 0;
  int64_t topk = 0;  // k
  int64_t heads = 0, dim_qk = 0, dim_v = 0;
  int64_t indexer_heads = 0, indexer_dim = 0;
  int64_t dense_size = 0;        // square matmul n x n x n
  int64_t copy_bytes = 0;        // device-to-device copy
  int64_t gather_rows = 0;       // the gather baseline's queries (the last ones: full windows)
  int64_t gather_chunk = 0;      // queries gathered per block, as bench/sparse_attn_bench.py
  int64_t table_block_rows = 0;  // score-table rows per block (Megatron-style selection)
  // N of the dense warm-up's indexer loss (dense_indexer_kl): every (query, visible key) pair, so
  // shorter than seq_len; at most seq_len.
  int64_t dense_loss_seq_len = 0;
  int64_t optimizer_parameters = 0;  // fp32 parameters the optimizer step updates
  int warmup = 1;
  int runs = 3;
};

// cuda: the H200-sized defaults (the CUDA kernels support only the DSA head dims, so --quick
// shrinks N and k there); else a CPU shape, with tiny head dims under --quick.
Shapes DefaultShapes(bool cuda, bool quick);

v1::Calibration::Shapes ToProto(const Shapes& shapes);

}  // namespace hyscale::calibrate
