// The small DSA model the CPU tests train: two layers, selection that really selects (top-4).
#pragma once

#include "worker/model/model.h"

namespace hyscale::trainer::testing {

inline ModelConfig SmallConfig() {
  ModelConfig c;
  c.vocab_size = 32;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  c.head_dim_qk = 8;
  c.rope_dim = 4;
  c.head_dim_v = 8;
  c.d_ff = 32;
  c.index_heads = 2;
  c.index_dim = 8;
  c.index_rope_dim = 4;
  c.topk = 4;
  return c;
}

}  // namespace hyscale::trainer::testing
