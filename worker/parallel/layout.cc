#include "worker/parallel/layout.h"

#include "absl/strings/str_cat.h"

namespace hyscale::parallel {

absl::StatusOr<Layout> ParseLayout(std::string_view name) {
  for (Layout layout : {Layout::kContiguous, Layout::kZigzag, Layout::kRoundRobin}) {
    if (name == LayoutName(layout)) return layout;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "layout must be one of contiguous, zigzag, round-robin; got '", std::string(name), "'"));
}

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kZigzag:
      return "zigzag";
    case Layout::kRoundRobin:
      return "round-robin";
  }
  return "unknown";
}

absl::StatusOr<std::vector<int64_t>> ShardPositions(Layout layout, int64_t seq_len, int world,
                                                    int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of world ", world));
  }
  const int64_t parts = layout == Layout::kZigzag ? 2 * world : world;
  if (seq_len <= 0 || seq_len % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len ", seq_len, " must split into ", parts,
                                                   " equal parts for the ", LayoutName(layout),
                                                   " layout over ", world, " ranks"));
  }
  std::vector<int64_t> positions;
  const auto add_chunk = [&positions](int64_t begin, int64_t length) {
    for (int64_t t = begin; t < begin + length; ++t) positions.push_back(t);
  };
  switch (layout) {
    case Layout::kContiguous:
      add_chunk(rank * (seq_len / world), seq_len / world);
      break;
    case Layout::kZigzag: {
      const int64_t chunk = seq_len / parts;
      add_chunk(rank * chunk, chunk);
      add_chunk((parts - 1 - rank) * chunk, chunk);
      break;
    }
    case Layout::kRoundRobin:
      for (int64_t t = rank; t < seq_len; t += world) positions.push_back(t);
      break;
  }
  return positions;
}

}  // namespace hyscale::parallel
