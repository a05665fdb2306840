// Top-k selections to run sparse attention on, and how much adjacent queries share.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyscale::calibrate {

// Causal, duplicate-free "local" selections as bench/sparse_attn_bench.py draws them (a trained
// indexer's: adjacent queries share most keys): half of each row the most recent k/2 keys, half
// one key per stratum of the older ones, drawn once per block of 16 queries. Rows with t + 1 <= k
// take every earlier key, -1 in the unused slots. [n, topk] int32 on the CPU.
at::Tensor LocalSelection(int64_t n, int64_t topk, uint64_t seed);

// Key de-duplication of groups of `group` adjacent queries: valid slots / entries of the groups'
// key unions (1 at group 1). The union is what a grouped kernel loads and computes over.
double DedupFactor(const at::Tensor& indices, int64_t group);

}  // namespace hyscale::calibrate
