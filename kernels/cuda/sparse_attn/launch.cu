// The launcher of the CUDA sparse MQA attention (the host API of kernels/cuda/sparse_attn_cuda.h):
// checks a call, builds its key lists (key_union.h), chooses the kernel family and hands the call
// to the kernels of its head shape (launch.cuh). docs/sparse_attn.md has the why.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/fixed_point_accumulate.cuh"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sparse_attn/key_union.h"
#include "kernels/cuda/sparse_attn/launch.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"
#include "kernels/cuda/sparse_attn_cuda.h"

namespace hyscale::cuda::attn {

dim3 grid_of(const SparseAttnShape& s, const Problem& p) {
  const int64_t blocks = groups_of(s, p.group) * ceil_div(s.heads, p.hb);
  if (blocks > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("hyscale::sparse_attn (CUDA): num_queries * heads is too large");
  }
  return dim3(static_cast<unsigned>(blocks));
}

namespace {

// D[row] = sum_c dO[row, c] * O[row, c] (fp32), one warp per row.
__global__ void row_dot_kernel(const bf16* a, const bf16* b, int64_t rows, int dim, float* out) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float sum = 0.f;
  for (int c = lane; c < dim; c += 32) {
    sum += __bfloat162float(a[row * dim + c]) * __bfloat162float(b[row * dim + c]);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
  if (lane == 0) out[row] = sum;
}

Problem make_problem(const SparseAttnShape& s, const void* q, const void* key, const void* value,
                     const int32_t* indices, float scale, int64_t group, const UnionPlan& plan) {
  Problem p{};
  p.q = static_cast<const bf16*>(q);
  p.key = static_cast<const bf16*>(key);
  p.value = static_cast<const bf16*>(value);
  p.indices = indices;
  p.ukeys = plan.keys;
  p.umask = plan.mask;
  p.ucount = plan.count;
  p.cap = plan.cap;
  p.n = static_cast<int>(s.num_queries);
  p.heads = static_cast<int>(s.heads);
  p.topk = static_cast<int>(s.topk);
  p.group = static_cast<int>(group);
  p.hb = static_cast<int>(std::min<int64_t>(s.heads, 64 / group));
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  return p;
}

template <class Fn>
void dispatch_dims(int64_t dim_qk, int64_t dim_v, Fn&& fn) {
#define HYSCALE_SA_CASE(DQ, DV)      \
  if (dim_qk == DQ && dim_v == DV) { \
    fn(SparseAttnTraits<DQ, DV>{});  \
    return;                          \
  }
  HYSCALE_SPARSE_ATTN_DIMS(HYSCALE_SA_CASE)
#undef HYSCALE_SA_CASE
  throw std::invalid_argument("hyscale::sparse_attn (CUDA): unsupported d_qk = " +
                              std::to_string(dim_qk) + ", d_v = " + std::to_string(dim_v));
}

void check_call(const SparseAttnShape& s, int64_t group) {
  s.validate();
  if (!cuda_sparse_attn_dims_supported(s.dim_qk, s.dim_v)) {
    throw std::invalid_argument(std::string("hyscale::sparse_attn (CUDA): the kernels take ") +
                                kCudaSparseAttnDims + "; got (" + std::to_string(s.dim_qk) + ", " +
                                std::to_string(s.dim_v) + ")");
  }
  if (!sparse_attn_group_supported(group, s.topk)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): group must be 1, 2, 4, 8 or 16 with group * topk <= " +
        std::to_string(kMaxGroupSlots) + "; got group = " + std::to_string(group) +
        ", topk = " + std::to_string(s.topk));
  }
  if (s.num_keys >= (int64_t(1) << 27) || s.num_queries * s.heads >= (int64_t(1) << 31)) {
    throw std::invalid_argument("hyscale::sparse_attn (CUDA): M must be < 2^27 and N * H < 2^31");
  }
}

// Whether a kernel family's traits take the shape's (d_qk, d_v).
template <template <int, int> class Traits>
bool traits_support(const SparseAttnShape& s) {
  if (!cuda_sparse_attn_dims_supported(s.dim_qk, s.dim_v)) return false;
  bool supported = false;
  dispatch_dims(s.dim_qk, s.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    supported = Traits<Tr::kDimQk, Tr::kDimV>::kSupported;
  });
  return supported;
}

// Whether the forward and the backward run on the wgmma kernels: whole 64-head tiles of one query.
bool wgmma_tiles(const SparseAttnShape& s, int64_t group) {
  return traits_support<SparseAttnWgmmaTraits>(s) && group == 1 && s.heads % 64 == 0;
}

}  // namespace
}  // namespace hyscale::cuda::attn

namespace hyscale::cuda {

using namespace attn;

bool sparse_attn_group_supported(int64_t group, int64_t topk) {
  const bool pow2 = group == 1 || group == 2 || group == 4 || group == 8 || group == 16;
  return pow2 && (group == 1 || group * topk <= kMaxGroupSlots);
}

int64_t sparse_attn_default_group(int64_t heads, int64_t topk) {
  int64_t g = 1;
  while (g * 2 <= kMaxGroup && g * 2 * heads <= 64 && sparse_attn_group_supported(g * 2, topk)) {
    g *= 2;
  }
  return g;
}

size_t sparse_attn_fwd_workspace_bytes(const SparseAttnShape& shape, int64_t group) {
  return plan_bytes(shape, group);
}

bool sparse_attn_fwd_reads_values_from_keys(const SparseAttnShape& shape, int64_t group) {
  return wgmma_tiles(shape, group) && traits_support<SparseAttnLatentTraits>(shape);
}

void sparse_attn_fwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, int64_t group,
                     void* out, float* lse, void* workspace, Stream stream_) {
  check_call(shape, group);
  const bool value_in_key = value == key;
  if (value_in_key && !sparse_attn_fwd_reads_values_from_keys(shape, group)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): value == key (values as the first d_v columns of the key "
        "rows) needs G = 1, H a multiple of 64, d_v <= d_qk and d_v a multiple of 128");
  }
  if (shape.num_queries == 0 || shape.heads == 0) return;
  auto stream = static_cast<cudaStream_t>(stream_);
  UnionPlan plan;
  build_plan(shape, indices, group, workspace, plan, stream);
  const FwdCall call{shape,
                     make_problem(shape, q, key, value, indices, scale, group, plan),
                     FwdOut{static_cast<bf16*>(out), lse},
                     wgmma_tiles(shape, group),
                     value_in_key,
                     stream};
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    launch_fwd<Tr::kDimQk, Tr::kDimV>(call);
  });
}

size_t sparse_attn_bwd_workspace_bytes(const SparseAttnShape& s, int64_t group,
                                       bool deterministic) {
  size_t bytes = plan_bytes(s, group) + align256(s.num_queries * s.heads * 4) + 256;
  if (deterministic) bytes += align256(s.num_keys * (s.dim_qk + s.dim_v) * 8);
  return bytes;
}

// D = rowsum(dO * O) of every (query, head) row into `workspace` (N H floats).
float* row_deltas(const SparseAttnShape& s, const void* out, const void* grad_out, void* workspace,
                  cudaStream_t stream) {
  const int64_t rows = s.num_queries * s.heads;
  auto* delta = static_cast<float*>(workspace);
  row_dot_kernel<<<static_cast<unsigned>(ceil_div(rows * 32, 256)), 256, 0, stream>>>(
      static_cast<const bf16*>(grad_out), static_cast<const bf16*>(out), rows,
      static_cast<int>(s.dim_v), delta);
  check(cudaGetLastError(), "row_dot_kernel");
  return delta;
}

void sparse_attn_bwd(const SparseAttnShape& shape, const void* q, const void* key,
                     const void* value, const int32_t* indices, float scale, const void* out,
                     const float* lse, const void* grad_out, int64_t group, bool deterministic,
                     void* grad_q, float* grad_key, float* grad_value, void* workspace,
                     Stream stream_) {
  check_call(shape, group);
  auto stream = static_cast<cudaStream_t>(stream_);
  const int64_t key_elems = shape.num_keys * shape.dim_qk,
                value_elems = shape.num_keys * shape.dim_v;
  check(cudaMemsetAsync(grad_key, 0, key_elems * 4, stream), "memset");
  check(cudaMemsetAsync(grad_value, 0, value_elems * 4, stream), "memset");
  if (shape.num_queries == 0 || shape.heads == 0) return;
  UnionPlan plan;
  auto* base = static_cast<unsigned char*>(workspace);
  base += build_plan(shape, indices, group, base, plan, stream);
  const int64_t rows = shape.num_queries * shape.heads;
  BwdArgs g{};
  g.grad_out = static_cast<const bf16*>(grad_out);
  g.lse = lse;
  g.grad_q = static_cast<bf16*>(grad_q);
  g.grad_key = grad_key;
  g.grad_value = grad_value;
  g.delta = row_deltas(shape, out, grad_out, base, stream);
  base += align256(rows * 4);
  auto* amax = reinterpret_cast<float*>(base);
  g.amax = amax;
  base += 256;
  if (deterministic) {
    g.fixed_key = reinterpret_cast<unsigned long long*>(base);
    g.fixed_value = g.fixed_key + key_elems;
    check(cudaMemsetAsync(g.fixed_key, 0, (key_elems + value_elems) * 8, stream), "memset");
    check(cudaMemsetAsync(amax, 0, 3 * sizeof(float), stream), "memset");
    const void* srcs[3] = {q, grad_out, value};
    const int64_t counts[3] = {rows * shape.dim_qk, rows * shape.dim_v, value_elems};
    for (int i = 0; i < 3; ++i) {
      absmax_kernel<<<264, 256, 0, stream>>>(static_cast<const bf16*>(srcs[i]), counts[i],
                                             amax + i);
      check(cudaGetLastError(), "absmax_kernel");
    }
  }
  const Problem p = make_problem(shape, q, key, value, indices, scale, group, plan);
  const BwdCall call{shape, p, g, wgmma_tiles(shape, group), deterministic, stream};
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    launch_bwd<Tr::kDimQk, Tr::kDimV>(call);
  });
  if (deterministic) {
    for (const bool is_key : {true, false}) {
      fixed_to_float_kernel<<<1024, 256, 0, stream>>>(
          is_key ? g.fixed_key : g.fixed_value, is_key ? key_elems : value_elems,
          DkvScaleOf{p, int(shape.dim_v), amax, is_key}, is_key ? grad_key : grad_value);
      check(cudaGetLastError(), "fixed_to_float_kernel");
    }
  }
}

bool sparse_attn_bwd_latent_supported(const SparseAttnShape& shape, int64_t group,
                                      bool deterministic) {
  return !deterministic && wgmma_tiles(shape, group) &&
         traits_support<SparseAttnLatentBwdTraits>(shape);
}

size_t sparse_attn_bwd_latent_workspace_bytes(const SparseAttnShape& shape) {
  return plan_bytes(shape, 1) + align256(shape.num_queries * shape.heads * 4);
}

void sparse_attn_bwd_latent(const SparseAttnShape& shape, const void* q, const void* kv,
                            const int32_t* indices, float scale, const void* out, const float* lse,
                            const void* grad_out, void* grad_q, float* grad_kv, float* mass,
                            void* workspace, Stream stream_) {
  check_call(shape, 1);
  if (!sparse_attn_bwd_latent_supported(shape, 1, false)) {
    throw std::invalid_argument(
        "hyscale::sparse_attn (CUDA): the latent backward needs G = 1, H a multiple of 64, d_v <= "
        "d_qk and d_qk >= 192");
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  check(cudaMemsetAsync(grad_kv, 0, shape.num_keys * shape.dim_qk * 4, stream), "memset");
  if (mass != nullptr) {
    check(cudaMemsetAsync(mass, 0, shape.num_queries * shape.topk * 4, stream), "memset");
  }
  if (shape.num_queries == 0 || shape.heads == 0) return;
  BwdArgs g{};
  g.mass = mass;
  g.grad_out = static_cast<const bf16*>(grad_out);
  g.lse = lse;
  g.grad_q = static_cast<bf16*>(grad_q);
  g.grad_key = grad_kv;
  UnionPlan plan;
  auto* base = static_cast<unsigned char*>(workspace);
  base += build_plan(shape, indices, 1, base, plan, stream);
  g.delta = row_deltas(shape, out, grad_out, base, stream);
  const BwdCall call{shape, make_problem(shape, q, kv, kv, indices, scale, 1, plan), g, true, false,
                     stream};
  dispatch_dims(shape.dim_qk, shape.dim_v, [&](auto traits) {
    using Tr = decltype(traits);
    launch_bwd_latent<Tr::kDimQk, Tr::kDimV>(call);
  });
}

}  // namespace hyscale::cuda
