// Shared by the coordinator and service tests: scratch directories, a valid tiny job spec and
// worker registrations.
#pragma once

#include <absl/status/status.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "hyscale/v1/service.pb.h"
#include "server/stream_source.h"

namespace hyscale::server::testing {

// A fresh, empty directory under $TMPDIR (mode 0700) named after the test; removed at exit.
std::string ScratchDir();

// A small valid spec (d_model 32, 1 layer, seq_len 64, 20 steps).
v1::JobSpec TinySpec();

v1::SubmitJobRequest SubmitRequest(int ranks = 1, int priority = 0, int max_restarts = 0);

// A worker with `gpus` GPUs of 80 GB.
v1::RegisterWorkerRequest WorkerRequest(const std::string& name, int gpus);

// Drains a stream on this thread, waiting for its wake-ups as a reactor would, and returns how it
// ended; `take` returning false stops it early (OK).
template <typename Message>
absl::Status DrainStream(StreamSource<Message>& source,
                         const std::function<bool(const Message&)>& take) {
  std::mutex mu;
  std::condition_variable woken;
  bool wake = false;
  for (;;) {
    std::vector<Message> out;
    const auto end = source.Pull(&out, [&] {
      std::lock_guard<std::mutex> lock(mu);
      wake = true;
      woken.notify_one();
    });
    for (const auto& message : out) {
      if (!take(message)) return absl::OkStatus();
    }
    if (end) return *end;
    if (out.empty()) {
      std::unique_lock<std::mutex> lock(mu);
      woken.wait(lock, [&] { return wake; });
      wake = false;
    }
  }
}

}  // namespace hyscale::server::testing
