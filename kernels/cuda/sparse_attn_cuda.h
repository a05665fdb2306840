// CUDA sparse MQA attention over selected keys (sm_90a; tensor cores through mma.sync), forward
// and backward, with query grouping.
//
// Host API over raw device pointers, so this header needs neither libtorch nor CUDA headers; the
// torch binding (kernels/torch/cuda.cc) checks shapes and calls it. Inputs: q [N, H, d_qk],
// key [M, d_qk], value [M, d_v] bf16, indices [N, topk] int32 (-1 = unused slot, no duplicates in
// a row), all contiguous on one device. The contract is kernels/sparse_attn.h; docs/sparse_attn.md
// explains the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_shapes.h"
#include "kernels/shapes.h"

namespace hyscale::cuda {

using Stream = void*;  // cudaStream_t

// (d_qk, d_v) as kernels/cuda_shapes.h lists them; any H >= 1, N, M < 2^27.
// G in {1, 2, 4, 8, 16}, and for G > 1 the group's slots G * topk at most 32768 (the key union
// is built by one block, in shared memory).
bool sparse_attn_group_supported(int64_t group, int64_t topk);
// The G the torch op uses: 1 when H >= 64 (a block's 64 rows are already one query's heads, so a
// union only adds masked work), else the largest supported G with G * H <= 64.
int64_t sparse_attn_default_group(int64_t heads, int64_t topk);

size_t sparse_attn_fwd_workspace_bytes(const SparseAttnShape& shape, int64_t group);
// out [N, H, d_v] bf16, lse [N, H] fp32 (natural log; -infinity for rows without valid slots).
// value == key means the absorbed-MLA layout: each value row is the first d_v columns of its key
// row ([M, d_qk] storage), gathered once for both products. Only where the next function says so.
void sparse_attn_fwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, int64_t group,
                     void* out, float* lse, void* workspace, Stream stream);
// Whether sparse_attn_fwd takes value == key for this shape and G (the wgmma forward: G = 1, H a
// multiple of 64, d_v <= d_qk).
bool sparse_attn_fwd_reads_values_from_keys(const SparseAttnShape& shape, int64_t group);

size_t sparse_attn_bwd_workspace_bytes(const SparseAttnShape& shape, int64_t group,
                                       bool deterministic);
// grad_q [N, H, d_qk] bf16; grad_key [M, d_qk] and grad_value [M, d_v] fp32 (overwritten).
// deterministic = false: fp32 atomics (order of additions varies run to run). deterministic =
// true: contributions rounded to 64-bit fixed point (a per-call scale from bounds on the inputs)
// and added as integers, which is associative, so the result is bit-identical on every run.
void sparse_attn_bwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, const void* out,
                     const float* lse, const void* grad_out, int64_t group, bool deterministic,
                     void* grad_q, float* grad_key, float* grad_value, void* workspace,
                     Stream stream);

// The backward of the absorbed-MLA layout (each value row the first d_v columns of its kv row,
// as sparse_attn_fwd's value == key): one kernel computes S and dP once a tile for dq and the kv
// rows' gradient. grad_q [N, H, d_qk] bf16; grad_kv [M, d_qk] fp32 (overwritten) holds both
// roles' gradients, the value part added into the first d_v columns. fp32 atomics only: where
// the next function says no (deterministic, G > 1, other shapes), take sparse_attn_bwd with the
// values apart and add its grad_value into grad_key. mass (null: not asked for): [N, topk] fp32,
// written (overwritten) with the probabilities the backward recomputes, summed over heads, at
// each slot (0 in -1 slots): the indexer's target before its row normalisation
// (selected_attention_mass), a by-product of the backward rather than a second pass.
bool sparse_attn_bwd_latent_supported(const SparseAttnShape& shape, int64_t group,
                                      bool deterministic);
size_t sparse_attn_bwd_latent_workspace_bytes(const SparseAttnShape& shape);
void sparse_attn_bwd_latent(const SparseAttnShape& shape, const void* q, const void* kv,
                            const int32_t* indices, float scale, const void* out, const float* lse,
                            const void* grad_out, void* grad_q, float* grad_kv, float* mass,
                            void* workspace, Stream stream);

}  // namespace hyscale::cuda
