#include "worker/trainer/cuda_shapes.h"

#include <absl/strings/str_cat.h>

#include "kernels/cuda_shapes.h"

namespace hyscale::trainer {

absl::Status CheckCudaShapes(const v1::JobSpec& spec, bool sparse) {
  const auto& model = spec.model();
  if (!cuda_indexer_shape_supported(model.indexer().heads(), model.indexer().dim())) {
    return absl::InvalidArgumentError(absl::StrCat("model.indexer.heads ", model.indexer().heads(),
                                                   " and model.indexer.dim ", model.indexer().dim(),
                                                   ": the CUDA kernels take ", kCudaIndexerShapes));
  }
  if (sparse && !cuda_sparse_attn_dims_supported(model.head_dim_qk(), model.head_dim_v())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.head_dim_qk ", model.head_dim_qk(), " and model.head_dim_v ",
                     model.head_dim_v(), ": the CUDA kernels take ", kCudaSparseAttnDims));
  }
  return absl::OkStatus();
}

}  // namespace hyscale::trainer
