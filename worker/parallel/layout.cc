#include "worker/parallel/layout.h"

#include "absl/strings/str_cat.h"

namespace hyscale::parallel {

absl::StatusOr<std::vector<int64_t>> ShardPositions(v1::CpLayout layout, int64_t seq_len, int world,
                                                    int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world ", world));
  }
  const int64_t parts = CpShards(layout, world);
  if (seq_len <= 0 || seq_len % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", seq_len, " must split into ", parts,
                                                   " equal parts for the ", CpLayoutName(layout),
                                                   " layout over ", world, " ranks"));
  }
  std::vector<int64_t> positions;
  const auto add_chunk = [&positions](int64_t begin, int64_t length) {
    for (int64_t t = begin; t < begin + length; ++t) positions.push_back(t);
  };
  switch (layout) {
    case v1::CP_LAYOUT_CONTIGUOUS:
      add_chunk(rank * (seq_len / world), seq_len / world);
      break;
    case v1::CP_LAYOUT_ZIGZAG: {
      const int64_t chunk = seq_len / parts;
      add_chunk(rank * chunk, chunk);
      add_chunk((parts - 1 - rank) * chunk, chunk);
      break;
    }
    case v1::CP_LAYOUT_ROUND_ROBIN:
      for (int64_t t = rank; t < seq_len; t += world) positions.push_back(t);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layout: not a sequence layout (", static_cast<int>(layout), ")"));
  }
  return positions;
}

}  // namespace hyscale::parallel
