#include "proto/cp_layout.h"

#include <absl/strings/str_cat.h>

#include <string>

namespace hyscale {

absl::StatusOr<v1::CpLayout> ParseCpLayout(std::string_view name) {
  for (const v1::CpLayout layout : kCpLayouts) {
    if (name == CpLayoutName(layout)) return layout;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be contiguous, zigzag or round-robin (got '", std::string(name), "')"));
}

const char* CpLayoutName(v1::CpLayout layout) {
  switch (layout) {
    case v1::CP_LAYOUT_CONTIGUOUS:
      return "contiguous";
    case v1::CP_LAYOUT_ZIGZAG:
      return "zigzag";
    case v1::CP_LAYOUT_ROUND_ROBIN:
      return "round-robin";
    default:
      return "unspecified";
  }
}

int64_t CpShards(v1::CpLayout layout, int ranks) {
  return layout == v1::CP_LAYOUT_ZIGZAG ? int64_t{2} * ranks : ranks;
}

}  // namespace hyscale
