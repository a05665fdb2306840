// The indexer's training path on the GPU: index-score backward at the selected keys and the KL
// loss between the indexer's scores and its target (indexer_loss_cuda.h). The target itself (the
// main-attention mass at the selected keys) runs on tensor cores through cuBLAS, in
// kernels/torch/cuda.cc.
//
// The gather kernel never touches an [N, M] table: a block owns one query row and walks its
// selected keys in tiles (indexer_loss_traits.cuh), on CUDA cores in fp32: the index backward is
// a few GFLOP per thousand rows.
//
// grad_k sums over the rows that selected a key, with fp32 atomics or, in the deterministic mode,
// with 64-bit fixed-point integer atomics (fixed_point_accumulate.cuh): the same bits every run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/fixed_point_accumulate.cuh"
#include "kernels/cuda/indexer_loss_cuda.h"
#include "kernels/cuda/indexer_loss_traits.cuh"
#include "kernels/cuda/launch_util.cuh"

namespace hyscale::cuda {
namespace {

constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// Rows of a bf16 matrix into shared fp32 rows of `stride` floats: row r of the tile is
// source(r) (null: zeros), `dim` values each.
template <class Source>
__device__ void load_rows(float* dst, int rows, int dim, int stride, Source source) {
  for (int e = threadIdx.x; e < rows * dim; e += blockDim.x) {
    const int r = e / dim, d = e % dim;
    const __nv_bfloat16* src = source(r);
    dst[r * stride + d] = src ? __bfloat162float(src[d]) : 0.f;
  }
}

// ---- index_score_backward ---------------------------------------------------------------------

// grad_k's fixed-point scale, from a bound no partial sum of grad_k[s] can exceed. grad_k[s] sums,
// over the (query t, slot i) pairs that selected s, sum_j c[t, j, i] q[t, j] with
// c[t, j, i] = g[t, i] w[t, j] (0 where the gate is closed), so any partial sum is at most
//   sum_t G_t W_t max|q| <= N max_t (G_t W_t) max|q|,  G_t = sum_{valid i} |g[t, i]|,
//                                                     W_t = sum_j |w[t, j]|
// (even if a row repeated a key). max|q| and max_t G_t W_t are maxima: the same every run.
struct GradKScaleOf {
  int64_t num_queries;
  const float* bounds;  // [2]: max|q|, max_t G_t W_t
  __device__ double operator()() const {
    return fixed_point_scale(double(num_queries) * bounds[0] * bounds[1]);
  }
};

// max_t G_t W_t (see GradKScaleOf) into *out (zeroed by the caller), one warp per row.
__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    row_grad_bound_kernel(int64_t rows, int64_t heads, int64_t topk, const float* w,
                          const int32_t* indices, const float* grad_scores, float* out) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * RowWarpTraits::kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float g = 0.f, wsum = 0.f;
  for (int64_t i = lane; i < topk; i += 32) {
    if (indices[row * topk + i] >= 0) g += fabsf(grad_scores[row * topk + i]);
  }
  for (int64_t j = lane; j < heads; j += 32) wsum += fabsf(w[row * heads + j]);
  const float bound = warp_sum(g) * warp_sum(wsum);
  if (lane == 0) atomic_max_nonnegative(out, bound);
}

// One block per query row. Per tile of 32 selected keys: each lane scores its key against the
// warp's heads (dots), the open ReLU gates become coefficients c[j, i] = g_i * w_j (0 when closed
// or the slot is unused), then grad_q[j] += sum_i c[j, i] k_i stays in registers across tiles,
// grad_w[j] += sum_i g_i * ReLU(dot) in a warp sum, and grad_k[s_i] += sum_j c[j, i] q_j goes to
// global memory with atomics (keys are shared between rows): fp32 into grad_k, or fixed point
// into fixed_k (kFixed, deterministic).
template <class Tr, bool kFixed>
__global__ void __launch_bounds__(Tr::kThreads)
    index_score_backward_kernel(const __nv_bfloat16* q, const __nv_bfloat16* keys, const float* w,
                                const int32_t* indices, int64_t topk, const float* grad_scores,
                                float* grad_q, float* grad_k, float* grad_w,
                                unsigned long long* fixed_k, GradKScaleOf fixed_scale_of) {
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [kHeads][kStride]
  float* ks = qs + Tr::kHeads * Tr::kStride;    // [kKeys][kStride]
  float* coef = ks + Tr::kKeys * Tr::kStride;   // [kHeads][kKeys]
  __shared__ int32_t tile_keys[Tr::kKeys];
  __shared__ float tile_grads[Tr::kKeys];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  double fixed_scale = 1;
  if constexpr (kFixed) fixed_scale = fixed_scale_of();

  load_rows(qs, Tr::kHeads, Tr::kDim, Tr::kStride,
            [&](int h) { return q + (row * Tr::kHeads + h) * Tr::kDim; });
  float weights[Tr::kHeadsPerWarp], gq[Tr::kHeadsPerWarp][Tr::kDimsPerLane], gw[Tr::kHeadsPerWarp];
#pragma unroll
  for (int r = 0; r < Tr::kHeadsPerWarp; ++r) {
    weights[r] = w[row * Tr::kHeads + warp + r * Tr::kWarps];
    gw[r] = 0.f;
#pragma unroll
    for (int c = 0; c < Tr::kDimsPerLane; ++c) gq[r][c] = 0.f;
  }

  for (int64_t first = 0; first < topk; first += Tr::kKeys) {
    __syncthreads();  // the previous tile is consumed (and the query loaded)
    if (threadIdx.x < Tr::kKeys) {
      const int64_t slot = first + threadIdx.x;
      const int32_t key = slot < topk ? indices[row * topk + slot] : -1;
      tile_keys[threadIdx.x] = key;
      tile_grads[threadIdx.x] = key >= 0 ? grad_scores[row * topk + slot] : 0.f;
    }
    __syncthreads();
    load_rows(ks, Tr::kKeys, Tr::kDim, Tr::kStride, [&](int i) -> const __nv_bfloat16* {
      return tile_keys[i] >= 0 ? keys + static_cast<int64_t>(tile_keys[i]) * Tr::kDim : nullptr;
    });
    __syncthreads();

    float dots[Tr::kHeadsPerWarp];
#pragma unroll
    for (int r = 0; r < Tr::kHeadsPerWarp; ++r) dots[r] = 0.f;
    const float* my_key = ks + lane * Tr::kStride;
#pragma unroll 4
    for (int d = 0; d < Tr::kDim; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(my_key + d);
#pragma unroll
      for (int r = 0; r < Tr::kHeadsPerWarp; ++r) {
        const float4 qv =
            *reinterpret_cast<const float4*>(qs + (warp + r * Tr::kWarps) * Tr::kStride + d);
        dots[r] = dot4(qv, kv, dots[r]);
      }
    }
    const bool used = tile_keys[lane] >= 0;
    const float g = tile_grads[lane];
#pragma unroll
    for (int r = 0; r < Tr::kHeadsPerWarp; ++r) {
      const bool open = used && dots[r] > 0.f;
      coef[(warp + r * Tr::kWarps) * Tr::kKeys + lane] = open ? g * weights[r] : 0.f;
      gw[r] += warp_sum(open ? g * dots[r] : 0.f);
    }
    __syncthreads();

#pragma unroll 2
    for (int i = 0; i < Tr::kKeys; ++i) {
      float kv[Tr::kDimsPerLane];
#pragma unroll
      for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) kv[cc] = ks[i * Tr::kStride + lane + cc * 32];
#pragma unroll
      for (int r = 0; r < Tr::kHeadsPerWarp; ++r) {
        const float c = coef[(warp + r * Tr::kWarps) * Tr::kKeys + i];
#pragma unroll
        for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) gq[r][cc] = fmaf(c, kv[cc], gq[r][cc]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < Tr::kKeysPerWarp; ++rr) {
      const int i = warp + rr * Tr::kWarps;
      const int32_t key = tile_keys[i];
      if (key < 0) continue;  // uniform across the warp
      float acc[Tr::kDimsPerLane];
#pragma unroll
      for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) acc[cc] = 0.f;
#pragma unroll 4
      for (int j = 0; j < Tr::kHeads; ++j) {
        const float c = coef[j * Tr::kKeys + i];
#pragma unroll
        for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) {
          acc[cc] = fmaf(c, qs[j * Tr::kStride + lane + cc * 32], acc[cc]);
        }
      }
#pragma unroll
      for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) {
        const int64_t at = static_cast<int64_t>(key) * Tr::kDim + lane + cc * 32;
        if constexpr (kFixed) {
          fixed_add(fixed_k + at, acc[cc], fixed_scale);
        } else {
          atomicAdd(grad_k + at, acc[cc]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < Tr::kHeadsPerWarp; ++r) {
    const int64_t head = row * Tr::kHeads + warp + r * Tr::kWarps;
#pragma unroll
    for (int cc = 0; cc < Tr::kDimsPerLane; ++cc) {
      grad_q[head * Tr::kDim + lane + cc * 32] = gq[r][cc];
    }
    if (lane == 0) grad_w[head] = gw[r];
  }
}

// ---- indexer_kl ---------------------------------------------------------------------------------

// Log-sum-exp of a row's valid scores, in every lane of the warp; -infinity when it has none.
__device__ float row_logsumexp(const float* s, int64_t topk, int lane) {
  float max_score = kNegInf;
  for (int64_t i = lane; i < topk; i += 32) max_score = fmaxf(max_score, s[i]);
  max_score = warp_max(max_score);
  if (max_score == kNegInf) return kNegInf;
  float sum = 0.f;
  for (int64_t i = lane; i < topk; i += 32) sum += expf(s[i] - max_score);  // exp(-inf) = 0
  return max_score + logf(warp_sum(sum));
}

__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    indexer_kl_fwd_kernel(int64_t rows, int64_t topk, const float* score, const float* target,
                          float* loss) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * RowWarpTraits::kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* s = score + row * topk;
  const float* p = target + row * topk;
  const float lse = row_logsumexp(s, topk, lane);
  float total = 0.f;
  for (int64_t i = lane; i < topk; i += 32) {
    if (s[i] != kNegInf && p[i] > 0.f) total += p[i] * (logf(p[i]) - (s[i] - lse));
  }
  total = warp_sum(total);
  if (lane == 0) loss[row] = total;
}

__global__ void __launch_bounds__(RowWarpTraits::kThreads)
    indexer_kl_bwd_kernel(int64_t rows, int64_t topk, const float* score, const float* target,
                          const float* grad_loss, float* grad_score) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * RowWarpTraits::kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* s = score + row * topk;
  const float* p = target + row * topk;
  float* g = grad_score + row * topk;
  const float lse = row_logsumexp(s, topk, lane);
  const float scale = grad_loss[row];
  for (int64_t i = lane; i < topk; i += 32) {
    g[i] = s[i] != kNegInf ? scale * (expf(s[i] - lse) - p[i]) : 0.f;
  }
}

// ---- Launchers ----------------------------------------------------------------------------------

template <class Fn>
void dispatch_indexer_shape(int64_t heads, int64_t dim, Fn&& fn) {
  auto with_dim = [&](auto heads_constant) {
    constexpr int kHeads = decltype(heads_constant)::value;
    if (dim == 128) return fn(ScoreGradTraits<kHeads, 128>{});
    if (dim == 64) return fn(ScoreGradTraits<kHeads, 64>{});
    throw std::invalid_argument(
        "hyscale::index_score_backward (CUDA): d_I must be 64 or 128, got " + std::to_string(dim));
  };
  if (heads == 64) return with_dim(std::integral_constant<int, 64>{});
  if (heads == 32) return with_dim(std::integral_constant<int, 32>{});
  if (heads == 16) return with_dim(std::integral_constant<int, 16>{});
  throw std::invalid_argument(
      "hyscale::index_score_backward (CUDA): H_I must be 16, 32 or 64, got " +
      std::to_string(heads));
}

unsigned row_warp_blocks(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, RowWarpTraits::kRowsPerBlock));
}

// The deterministic mode's workspace: grad_k in fixed point, then the two bounds.
size_t fixed_grad_k_bytes(const IndexerShape& shape) {
  return static_cast<size_t>(shape.num_keys * shape.dim) * sizeof(unsigned long long);
}

}  // namespace

size_t index_score_backward_workspace_bytes(const IndexerShape& shape, bool deterministic) {
  return deterministic ? fixed_grad_k_bytes(shape) + 2 * sizeof(float) : 0;
}

void index_score_backward(const IndexerShape& shape, const void* q, const void* k, const float* w,
                          const int32_t* indices, int64_t topk, const float* grad_scores,
                          bool deterministic, float* grad_q, float* grad_k, float* grad_w,
                          void* workspace, Stream stream) {
  const char* op = "hyscale::index_score_backward (CUDA)";
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  throw_on_error(
      cudaMemsetAsync(grad_k, 0, shape.num_keys * shape.dim * sizeof(float), cuda_stream), op,
      "zeroing grad_k");
  if (shape.num_queries == 0) return;
  const auto* q16 = static_cast<const __nv_bfloat16*>(q);
  unsigned long long* fixed_k = nullptr;
  GradKScaleOf scale_of{shape.num_queries, nullptr};
  if (deterministic) {
    fixed_k = static_cast<unsigned long long*>(workspace);
    auto* bounds = reinterpret_cast<float*>(fixed_k + shape.num_keys * shape.dim);
    scale_of.bounds = bounds;
    throw_on_error(cudaMemsetAsync(fixed_k, 0, fixed_grad_k_bytes(shape), cuda_stream), op,
                   "zeroing the fixed-point grad_k");
    throw_on_error(cudaMemsetAsync(bounds, 0, 2 * sizeof(float), cuda_stream), op,
                   "zeroing the bounds");
    absmax_kernel<<<264, 256, 0, cuda_stream>>>(q16, shape.num_queries * shape.heads * shape.dim,
                                                bounds);
    throw_on_error(cudaGetLastError(), op, "absmax_kernel launch");
    row_grad_bound_kernel<<<row_warp_blocks(shape.num_queries), RowWarpTraits::kThreads, 0,
                            cuda_stream>>>(shape.num_queries, shape.heads, topk, w, indices,
                                           grad_scores, bounds + 1);
    throw_on_error(cudaGetLastError(), op, "row_grad_bound_kernel launch");
  }
  dispatch_indexer_shape(shape.heads, shape.dim, [&](auto traits) {
    using Tr = decltype(traits);
    constexpr size_t kSmem = Tr::kSmemFloats * sizeof(float);
    auto kernel = deterministic ? index_score_backward_kernel<Tr, true>
                                : index_score_backward_kernel<Tr, false>;
    throw_on_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                   op, "shared memory size");
    kernel<<<static_cast<unsigned>(shape.num_queries), Tr::kThreads, kSmem, cuda_stream>>>(
        q16, static_cast<const __nv_bfloat16*>(k), w, indices, topk, grad_scores, grad_q, grad_k,
        grad_w, fixed_k, scale_of);
    throw_on_error(cudaGetLastError(), op, "kernel launch");
  });
  if (deterministic) {
    fixed_to_float_kernel<<<1024, 256, 0, cuda_stream>>>(fixed_k, shape.num_keys * shape.dim,
                                                         scale_of, grad_k);
    throw_on_error(cudaGetLastError(), op, "fixed_to_float_kernel launch");
  }
}

void indexer_kl_fwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    float* loss, Stream stream) {
  if (rows == 0) return;
  indexer_kl_fwd_kernel<<<row_warp_blocks(rows), RowWarpTraits::kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(rows, topk, score, target, loss);
  throw_on_error(cudaGetLastError(), "hyscale::indexer_kl (CUDA)", "kernel launch");
}

void indexer_kl_bwd(int64_t rows, int64_t topk, const float* score, const float* target,
                    const float* grad_loss, float* grad_score, Stream stream) {
  if (rows == 0) return;
  indexer_kl_bwd_kernel<<<row_warp_blocks(rows), RowWarpTraits::kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(rows, topk, score, target, grad_loss,
                                                               grad_score);
  throw_on_error(cudaGetLastError(), "hyscale::indexer_kl_backward (CUDA)", "kernel launch");
}

}  // namespace hyscale::cuda
