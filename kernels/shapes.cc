#include "kernels/shapes.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace hyscale {
namespace {

void require(bool ok, const char* shape, const char* field, const char* rule, int64_t got) {
  if (!ok) {
    throw std::invalid_argument(std::string(shape) + "." + field + " must be " + rule + " (got " +
                                std::to_string(got) + ")");
  }
}

// Selections are int32 key indices, so every key index must fit in one.
constexpr int64_t kMaxKeys = std::numeric_limits<int32_t>::max();

void require_counts(const char* shape, int64_t num_queries, int64_t num_keys) {
  require(num_queries >= 0, shape, "num_queries", ">= 0", num_queries);
  require(num_keys >= 0, shape, "num_keys", ">= 0", num_keys);
  require(num_keys <= kMaxKeys, shape, "num_keys", "<= 2^31 - 1", num_keys);
}

}  // namespace

void IndexerShape::validate() const {
  require_counts("IndexerShape", num_queries, num_keys);
  require(heads > 0, "IndexerShape", "heads", "> 0", heads);
  require(dim > 0, "IndexerShape", "dim", "> 0", dim);
  require(q_offset >= 0, "IndexerShape", "q_offset", ">= 0", q_offset);
  require(visibility.tokens_per_key > 0, "IndexerShape", "visibility.tokens_per_key", "> 0",
          visibility.tokens_per_key);
}

void DenseIndexerShape::validate() const {
  indexer.validate();
  require(heads > 0, "DenseIndexerShape", "heads", "> 0", heads);
  require(dim_qk > 0, "DenseIndexerShape", "dim_qk", "> 0", dim_qk);
}

void SparseAttnShape::validate() const {
  require_counts("SparseAttnShape", num_queries, num_keys);
  require(heads > 0, "SparseAttnShape", "heads", "> 0", heads);
  require(dim_qk > 0, "SparseAttnShape", "dim_qk", "> 0", dim_qk);
  require(dim_v > 0, "SparseAttnShape", "dim_v", "> 0", dim_v);
  require(topk > 0, "SparseAttnShape", "topk", "> 0", topk);
}

}  // namespace hyscale
