// Sequence layouts for context parallelism (DESIGN.md section 5): which global token positions
// each of P ranks holds.
//   contiguous:  rank r holds [r*N/P, (r+1)*N/P): simple, but under a causal mask the last rank
//                has P times the attention work of the first.
//   zigzag:      the sequence in 2P chunks, rank r holds chunks r and 2P-1-r (Megatron / ring
//                attention's pairing): every rank gets the same causal work.
//   round-robin: token t on rank t mod P: balanced, but every query is its own run of
//                positions, so the kernels are called once per token.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cp_layout.h"

namespace hyscale::parallel {

// The global positions rank `rank` of `world` holds, increasing. Fails unless seq_len splits
// evenly (CpShards: into P parts, 2P for zigzag).
absl::StatusOr<std::vector<int64_t>> ShardPositions(v1::CpLayout layout, int64_t seq_len, int world,
                                                    int rank);

}  // namespace hyscale::parallel
