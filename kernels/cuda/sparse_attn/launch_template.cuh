// The launches of one head shape's kernels (launch.cuh declares them); each instantiate_*.cu
// compiles them for one (d_qk, d_v), so that the shapes' kernels build apart and in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/sparse_attn/bwd_latent.cuh"
#include "kernels/cuda/sparse_attn/bwd_mma.cuh"
#include "kernels/cuda/sparse_attn/bwd_wgmma.cuh"
#include "kernels/cuda/sparse_attn/fwd_latent.cuh"
#include "kernels/cuda/sparse_attn/fwd_mma.cuh"
#include "kernels/cuda/sparse_attn/fwd_wgmma.cuh"
#include "kernels/cuda/sparse_attn/launch.cuh"
#include "kernels/cuda/sparse_attn/traits.cuh"

namespace hyscale::cuda::attn {

template <int kDimQk, int kDimV>
void launch_fwd(const FwdCall& call) {
  using Tr = SparseAttnTraits<kDimQk, kDimV>;
  using Wg = SparseAttnWgmmaTraits<kDimQk, kDimV>;
  if (!Wg::kSupported || !call.wgmma_tiles) {
    const size_t smem = size_t(Tr::kFwdSmemElems) * sizeof(bf16);
    check(cudaFuncSetAttribute(sparse_attn_fwd_kernel<Tr>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "forward smem");
    sparse_attn_fwd_kernel<Tr>
        <<<grid_of(call.shape, call.p), Tr::kThreads, smem, call.stream>>>(call.p, call.out);
    check(cudaGetLastError(), "sparse_attn_fwd_kernel");
    return;
  }
  if constexpr (Wg::kSupported) {
    auto launch = [&](auto kernel, int threads, int smem, bool persistent) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            "forward smem");
      dim3 grid = grid_of(call.shape, call.p);
      if (persistent) grid.x = std::min(grid.x, resident_blocks(kernel, threads, smem, kOp));
      kernel<<<grid, threads, smem, call.stream>>>(call.p, call.out);
      check(cudaGetLastError(), "sparse_attn forward kernel");
    };
    using Latent = SparseAttnLatentTraits<kDimQk, kDimV>;
    if constexpr (Latent::kSupported) {
      if (call.value_in_key) {
        launch(sparse_attn_fwd_latent_kernel<Latent>, Latent::kThreads, Latent::kSmemBytes, true);
        return;
      }
    }
    launch(sparse_attn_fwd_wgmma_kernel<Wg>, Wg::kThreads, Wg::kFwdSmemBytes, false);
  }
}

template <int kDimQk, int kDimV>
void launch_bwd(const BwdCall& call) {
  using Tr = SparseAttnTraits<kDimQk, kDimV>;
  using Wg = SparseAttnWgmmaTraits<kDimQk, kDimV>;
  static_assert(Wg::kThreads == Tr::kThreads, "one launch shape for both kernel families");
  auto launch = [&](auto kernel, int smem) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "backward smem");
    kernel<<<grid_of(call.shape, call.p), Tr::kThreads, smem, call.stream>>>(call.p, call.g);
    check(cudaGetLastError(), "sparse_attn backward kernel");
  };
  // wgmma kernels for whole 64-head tiles of one query, the mma.sync ones otherwise.
  if constexpr (Wg::kSupported) {
    if (call.wgmma_tiles) {
      launch(sparse_attn_bwd_dq_wgmma_kernel<Wg>, Wg::kBwdSmemBytes);
      if (call.deterministic) {
        launch(sparse_attn_bwd_dkv_wgmma_kernel<Wg, kDkvFixed>, Wg::kBwdSmemBytes);
      } else {
        launch(sparse_attn_bwd_dkv_wgmma_kernel<Wg, kDkvAtomic>, Wg::kBwdSmemBytes);
      }
      return;
    }
  }
  const int smem = int(Tr::kBwdSmemElems * sizeof(bf16));
  launch(sparse_attn_bwd_kernel<Tr, kDq>, smem);
  if (call.deterministic) {
    launch(sparse_attn_bwd_kernel<Tr, kDkvFixed>, smem);
  } else {
    launch(sparse_attn_bwd_kernel<Tr, kDkvAtomic>, smem);
  }
}

template <int kDimQk, int kDimV>
void launch_bwd_latent(const BwdCall& call) {
  using Tr = SparseAttnLatentBwdTraits<kDimQk, kDimV>;
  if constexpr (Tr::kSupported) {
    // The query's 64-head blocks are adjacent in the grid: pairs of them form the clusters.
    const bool paired = Tr::kPairable && call.shape.heads % (2 * Tr::kRows) == 0;
    const bool mass = call.g.mass != nullptr;
    auto kernel = mass ? sparse_attn_bwd_latent_kernel<Tr, false, true>
                       : sparse_attn_bwd_latent_kernel<Tr, false, false>;
    if constexpr (Tr::kPairable) {
      if (paired) {
        kernel = mass ? sparse_attn_bwd_latent_kernel<Tr, true, true>
                      : sparse_attn_bwd_latent_kernel<Tr, true, false>;
      }
    }
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
          "backward smem");
    BwdArgs g = call.g;
    g.resident_queries =
        static_cast<int>(resident_blocks(kernel, Tr::kThreads, Tr::kSmemBytes, kOp) /
                         ceil_div(call.shape.heads, Tr::kRows));
    cudaLaunchConfig_t config{};
    config.gridDim = grid_of(call.shape, call.p);
    config.blockDim = dim3(Tr::kThreads);
    config.dynamicSmemBytes = Tr::kSmemBytes;
    config.stream = call.stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = paired ? 2 : 1;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    check(cudaLaunchKernelEx(&config, kernel, call.p, g), "sparse_attn_bwd_latent_kernel");
  }
}

}  // namespace hyscale::cuda::attn

// The explicit instantiations of one shape's launches (the body of each instantiate_*.cu).
#define HYSCALE_SPARSE_ATTN_INSTANTIATE(DQ, DV)                 \
  namespace hyscale::cuda::attn {                               \
  template void launch_fwd<DQ, DV>(const FwdCall& call);        \
  template void launch_bwd<DQ, DV>(const BwdCall& call);        \
  template void launch_bwd_latent<DQ, DV>(const BwdCall& call); \
  }
