#include "worker/trainer/cuda_shapes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hyscale::trainer {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(int indexer_heads, int indexer_dim, int dim_qk, int dim_v) {
  v1::JobSpec spec;
  auto* model = spec.mutable_model();
  model->mutable_indexer()->set_heads(indexer_heads);
  model->mutable_indexer()->set_dim(indexer_dim);
  model->set_head_dim_qk(dim_qk);
  model->set_head_dim_v(dim_v);
  return spec;
}

TEST(CudaShapesTest, KernelShapesPass) {
  EXPECT_TRUE(CheckCudaShapes(Spec(16, 64, 64, 64), /*sparse=*/true).ok());
  EXPECT_TRUE(CheckCudaShapes(Spec(64, 128, 576, 512), /*sparse=*/true).ok());
}

TEST(CudaShapesTest, IndexerShapeIsCheckedEvenWithoutSparseStages) {
  const absl::Status status = CheckCudaShapes(Spec(2, 16, 64, 64), /*sparse=*/false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("model.indexer.heads 2"));
  EXPECT_THAT(status.message(), HasSubstr("model.indexer.dim 16"));
}

TEST(CudaShapesTest, AttentionDimsAreCheckedOnlyWhenSparse) {
  EXPECT_TRUE(CheckCudaShapes(Spec(16, 64, 16, 16), /*sparse=*/false).ok());
  const absl::Status status = CheckCudaShapes(Spec(16, 64, 16, 16), /*sparse=*/true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("model.head_dim_qk 16"));
}

}  // namespace
}  // namespace hyscale::trainer
