// Between the launcher (launch.cu) and the kernels of each head shape (launch_template.cuh,
// instantiated once a shape by instantiate_*.cu): what a call hands the kernels, and the host
// helpers both sides use.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sparse_attn/bwd_common.cuh"
#include "kernels/cuda/sparse_attn/fwd_common.cuh"
#include "kernels/shapes.h"

namespace hyscale::cuda::attn {

constexpr const char* kOp = "hyscale::sparse_attn (CUDA)";

inline void check(cudaError_t status, const char* what) {
  throw_on_error(status, kOp, what);
}

// One block a tile of rows (G queries x HB heads).
dim3 grid_of(const SparseAttnShape& s, const Problem& p);

// The launcher has checked the call and chosen the kernel family: wgmma_tiles when the blocks are
// whole 64-head tiles of one query (G = 1, H a multiple of 64), which the wgmma kernels take.
struct FwdCall {
  SparseAttnShape shape;
  Problem p;
  FwdOut out;
  bool wgmma_tiles;
  bool value_in_key;  // the values are the first d_v columns of the key rows
  cudaStream_t stream;
};
struct BwdCall {
  SparseAttnShape shape;
  Problem p;
  BwdArgs g;
  bool wgmma_tiles;
  bool deterministic;
  cudaStream_t stream;
};

// The kernels of one (d_qk, d_v): launch_template.cuh defines these, and instantiate_*.cu
// instantiates them for each shape of kernels/cuda_shapes.h (a shape without its file fails to
// link).
template <int kDimQk, int kDimV>
void launch_fwd(const FwdCall& call);
// dq, then the key and value rows' gradient (fixed point when deterministic: the launcher
// converts it).
template <int kDimQk, int kDimV>
void launch_bwd(const BwdCall& call);
// The latent backward (sparse_attn_bwd_latent_supported has said yes for the call).
template <int kDimQk, int kDimV>
void launch_bwd_latent(const BwdCall& call);

}  // namespace hyscale::cuda::attn
