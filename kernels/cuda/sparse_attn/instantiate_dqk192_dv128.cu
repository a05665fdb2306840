// The kernels of (d_qk, d_v) = (192, 128), a shape of kernels/cuda_shapes.h.
#include "kernels/cuda/sparse_attn/launch_template.cuh"

HYSCALE_SPARSE_ATTN_INSTANTIATE(192, 128)
