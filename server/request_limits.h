// Size caps on what the API takes: every string, bytes and repeated (or map) field of a request,
// nested messages included. One oversized field (a 4 MiB cancel reason) would otherwise be stored
// with the job and make every later GetJob and ListJobs answer too big for clients to read.
#pragma once

#include <absl/status/status.h>
#include <google/protobuf/message.h>

#include <cstddef>

namespace hyscale::server {

inline constexpr size_t kMaxFieldBytes = 4096;           // a string or bytes field
inline constexpr size_t kMaxReportChunkBytes = 1 << 20;  // RankReport.log and .event_json
inline constexpr int kMaxRepeatedEntries = 4096;         // a repeated or map field

// OK, or INVALID_ARGUMENT naming the first field over its cap by its path ("spec.stages[2].name:
// 5000 bytes exceeds the limit of 4096").
absl::Status CheckFieldSizes(const google::protobuf::Message& request);

}  // namespace hyscale::server
