// The producer of one server-streaming call, pulled without blocking, so that gRPC's callback API
// serves every stream without a thread of its own (StreamReactor); tests drain it directly.
#pragma once

#include <absl/status/status.h>

#include <functional>
#include <optional>
#include <vector>

namespace hyscale::server {

template <typename Message>
class StreamSource {
 public:
  virtual ~StreamSource() = default;

  // Appends the messages ready now to `out` and returns nullopt to go on, or the status that ends
  // the stream once they are written. When it appends nothing and goes on, it calls `wake` once
  // more may be ready: from any thread and possibly under the coordinator's lock, so `wake` only
  // posts work. No call of `wake` starts once the source is destroyed.
  virtual std::optional<absl::Status> Pull(std::vector<Message>* out,
                                           std::function<void()> wake) = 0;
};

}  // namespace hyscale::server
