// What the forward kernels share: their output, and the online softmax of rows whose keys two
// halves of the block split between them.
#pragma once

#include <cmath>

#include "kernels/cuda/sparse_attn/common.cuh"

namespace hyscale::cuda::attn {

struct FwdOut {
  bf16* out;
  float* lse;
};

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// The forward kernels split a tile's columns (keys) between two halves of the block: a thread's
// two rows (ra, rb) get their per-tile maxima and final sums from both halves through
// `halves[2][64]` in shared memory. Both helpers below hold a block barrier.

// The barrier of the helpers below: the whole block, or (warp-specialized kernels) the threads
// that hold the rows.
struct BlockBarrier {
  __device__ void operator()() const { __syncthreads(); }
};

// Publishes this half's quad-reduced values of the thread's two rows, then waits for the other.
template <class Barrier = BlockBarrier>
__device__ __forceinline__ void publish_rows(float (*halves)[64], int half, int ra, int rb, float a,
                                             float b, int lane, Barrier barrier = {}) {
  if (lane % 4 == 0) {
    halves[half][ra] = a;
    halves[half][rb] = b;
  }
  barrier();
}

// What moving a row's running maximum (log2 units) to new_max multiplies its old sums and
// accumulators by: 1 while the row has seen nothing (its maximum stays -inf).
__device__ __forceinline__ float rescale_factor(float old_max, float new_max) {
  return new_max == -INFINITY ? 1.f : exp2f(old_max - new_max);
}
// 2^x in one MUFU.EX2: exp2f without fast math adds a denormal fix-up around it; probabilities
// below 2^-126 contribute nothing to the sums.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The base a row's scores are taken against: 0 while it has seen nothing, so its probabilities
// stay exactly 0.
__device__ __forceinline__ float softmax_base(float new_max) {
  return new_max == -INFINITY ? 0.f : new_max;
}

// One online-softmax step: this tile's row maxima (mx_a, mx_b over this thread's columns) of
// both halves raise the running maxima m_a, m_b; gives the factors that rescale the old sums and
// accumulators, and the bases this tile's scores are taken against (0 while a row has seen
// nothing, so its probabilities stay exactly 0).
struct SoftmaxStep {
  float alpha_a, alpha_b, base_a, base_b;
};
__device__ __forceinline__ SoftmaxStep online_softmax_step(float (*halves)[64], int half, int ra,
                                                           int rb, int lane, float mx_a, float mx_b,
                                                           float& m_a, float& m_b) {
  publish_rows(halves, half, ra, rb, quad_max(mx_a), quad_max(mx_b), lane);
  const float new_a = fmaxf(m_a, fmaxf(halves[0][ra], halves[1][ra]));
  const float new_b = fmaxf(m_b, fmaxf(halves[0][rb], halves[1][rb]));
  SoftmaxStep step;
  step.alpha_a = rescale_factor(m_a, new_a);
  step.alpha_b = rescale_factor(m_b, new_b);
  step.base_a = softmax_base(new_a);
  step.base_b = softmax_base(new_b);
  m_a = new_a;
  m_b = new_b;
  return step;
}

// The final row sums (l over this thread's columns) of both halves: totals and their inverses
// (0 for rows that saw nothing).
struct RowTotals {
  float tot_a, tot_b, inv_a, inv_b;
};
template <class Barrier = BlockBarrier>
__device__ __forceinline__ RowTotals row_totals(float (*halves)[64], int half, int ra, int rb,
                                                int lane, float l_a, float l_b,
                                                Barrier barrier = {}) {
  publish_rows(halves, half, ra, rb, quad_sum(l_a), quad_sum(l_b), lane, barrier);
  RowTotals t;
  t.tot_a = halves[0][ra] + halves[1][ra];
  t.tot_b = halves[0][rb] + halves[1][rb];
  t.inv_a = t.tot_a > 0.f ? 1.f / t.tot_a : 0.f;
  t.inv_b = t.tot_b > 0.f ? 1.f / t.tot_b : 0.f;
  return t;
}

// lse (natural log) of a row from its running maximum (log2 units) and sum.
__device__ __forceinline__ void write_lse(float* lse, int64_t row, float max_log2, float total) {
  constexpr float kLn2 = 0.6931471805599453f;
  if (row >= 0) lse[row] = total > 0.f ? (max_log2 + log2f(total)) * kLn2 : -INFINITY;
}

}  // namespace hyscale::cuda::attn
