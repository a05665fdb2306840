#include "bench/service/submit_load.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "hyscale/v1/service.grpc.pb.h"

namespace hyscale::bench {

void RunSubmitLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                   const rpc::ClientOptions& client, const v1::JobSpec& spec,
                   const SubmitLoadOptions& options, SubmitLoadResult* result) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> ok{0}, failed{0}, not_pending{0};
  std::mutex error_mu;
  std::mutex completions_mu;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::JobService::NewStub(channels[t % channels.size()]);
      v1::SubmitJobRequest request;
      *request.mutable_spec() = spec;
      request.mutable_resources()->set_ranks(1);
      request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);
      for (int64_t i = next++; i < options.submissions; i = next++) {
        const std::string name = absl::StrCat("load-", options.run_id, "-a", i);
        request.mutable_spec()->set_name(name);
        request.set_request_id(name);
        grpc::ClientContext context;
        rpc::PrepareCall(&context, client);
        v1::Job job;
        auto call_start = Clock::now();
        if (options.rate > 0) {
          call_start = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(i / options.rate));
          std::this_thread::sleep_until(call_start);
        }
        const grpc::Status status = stub->SubmitJob(&context, request, &job);
        if (!status.ok()) {
          ++failed;
          std::lock_guard<std::mutex> lock(error_mu);
          if (result->first_error.empty()) {
            result->first_error =
                absl::StrCat("SubmitJob: code ", status.error_code(), ": ", status.error_message());
          }
          continue;
        }
        result->latency.AddSince(call_start);
        {
          std::lock_guard<std::mutex> lock(completions_mu);
          result->completions.push_back(Clock::now());
        }
        ++ok;
        if (job.state() != v1::JOB_STATE_PENDING) ++not_pending;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  result->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result->ok = ok;
  result->failed = failed;
  result->not_pending = not_pending;
  std::sort(result->completions.begin(), result->completions.end());
}

double SubmitLoadResult::PerSecondBetween(size_t first, size_t count) const {
  if (count < 2 || first + count > completions.size()) return 0;
  const double seconds =
      std::chrono::duration<double>(completions[first + count - 1] - completions[first]).count();
  return seconds > 0 ? static_cast<double>(count - 1) / seconds : 0;
}

}  // namespace hyscale::bench
