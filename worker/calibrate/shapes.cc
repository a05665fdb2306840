#include "worker/calibrate/shapes.h"

#include <algorithm>

namespace hyscale::calibrate {

Shapes DefaultShapes(bool cuda, bool quick) {
  Shapes s;
  s.heads = 128;
  s.dim_qk = 576;
  s.dim_v = 512;
  s.indexer_heads = 64;
  s.indexer_dim = 128;
  if (cuda) {
    // About 40 s on an H200: sparse attention fwd + bwd dominate (~0.75 s per G per run);
    // selection at 128K takes ~0.9 s per run (362 TFLOP/s there against 278 at 32K); the indexer
    // loss's two ops ~0.45 s per run at the built-in profile's rates.
    s.seq_len = quick ? 4096 : 32768;
    s.selection_seq_len = quick ? 4096 : 131072;
    s.topk = quick ? 512 : 2048;
    s.dense_size = quick ? 2048 : 8192;
    s.copy_bytes = int64_t{quick ? 64 : 1024} << 20;
    s.gather_rows = quick ? 512 : 4096;
    s.gather_chunk = 256;
    s.table_block_rows = 8192;
    // The dense warm-up's loss: 6.6 TFLOP of DenseIndexerLossFlops at 8K and H = 128, ~15 ms at
    // the H100's measured rate.
    s.dense_loss_seq_len = quick ? 2048 : 8192;
    s.optimizer_parameters = int64_t{quick ? 8 : 256} << 20;  // 256M: 4 GiB of state, ~6 ms
    s.runs = quick ? 2 : 3;
  } else if (quick) {  // for tests: every figure in well under a second
    s.heads = 4;
    s.dim_qk = 32;
    s.dim_v = 32;
    s.indexer_heads = 4;
    s.indexer_dim = 16;
    s.seq_len = 128;
    s.topk = 16;
    s.dense_size = 128;
    s.copy_bytes = int64_t{4} << 20;
    s.gather_rows = 64;
    s.gather_chunk = 32;
    s.table_block_rows = 64;
    s.optimizer_parameters = int64_t{1} << 18;
    s.runs = 2;
  } else {  // the DSA head dims at a short length: about half a minute on a few cores
    s.seq_len = 256;
    s.selection_seq_len = 512;
    s.topk = 64;
    s.dense_size = 1024;
    s.copy_bytes = int64_t{256} << 20;
    s.gather_rows = 256;
    s.gather_chunk = 64;
    s.table_block_rows = 256;
    s.optimizer_parameters = int64_t{16} << 20;
  }
  if (s.selection_seq_len == 0) s.selection_seq_len = s.seq_len;
  if (s.dense_loss_seq_len == 0) s.dense_loss_seq_len = s.seq_len;
  s.dense_loss_seq_len = std::min(s.dense_loss_seq_len, s.seq_len);
  s.gather_rows = std::min(s.gather_rows, s.seq_len);
  return s;
}

v1::Calibration::Shapes ToProto(const Shapes& s) {
  v1::Calibration::Shapes out;
  out.set_seq_len(s.seq_len);
  out.set_selection_seq_len(s.selection_seq_len);
  out.set_topk(s.topk);
  out.set_heads(s.heads);
  out.set_dim_qk(s.dim_qk);
  out.set_dim_v(s.dim_v);
  out.set_indexer_heads(s.indexer_heads);
  out.set_indexer_dim(s.indexer_dim);
  out.set_dense_size(s.dense_size);
  out.set_copy_bytes(s.copy_bytes);
  out.set_gather_rows(s.gather_rows);
  out.set_gather_chunk(s.gather_chunk);
  out.set_table_block_rows(s.table_block_rows);
  out.set_warmup(s.warmup);
  out.set_runs(s.runs);
  out.set_dense_loss_seq_len(s.dense_loss_seq_len);
  out.set_optimizer_parameters(s.optimizer_parameters);
  return out;
}

}  // namespace hyscale::calibrate
