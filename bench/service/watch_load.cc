#include "bench/service/watch_load.h"

#include <absl/strings/str_cat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "hyscale/v1/service.grpc.pb.h"

namespace hyscale::bench {
namespace {

// How long the streams get to open, and then to deliver the cancellations and end.
constexpr auto kOpenTimeout = std::chrono::seconds(120);
constexpr auto kEndTimeout = std::chrono::seconds(120);

// What every watcher reports to.
class Tally {
 public:
  explicit Tally(size_t jobs) : cancel_called_(jobs) {}

  void Opened() {
    std::lock_guard<std::mutex> lock(mu_);
    ++opened_;
    last_open_ = Clock::now();
    changed_.notify_all();
  }
  void SawCancel(size_t job, WatchLoadResult* result) {
    std::lock_guard<std::mutex> lock(mu_);
    ++result->cancelled;
    result->fanout.Add(Clock::now() - cancel_called_[job]);
  }
  void Ended(const grpc::Status& status, WatchLoadResult* result) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok()) {
      ++result->ended_ok;
    } else {
      ++result->failed;
      if (result->first_error.empty()) {
        result->first_error =
            absl::StrCat("WatchJob: code ", status.error_code(), ": ", status.error_message());
      }
    }
    ++ended_;
    changed_.notify_all();
  }
  // Recorded before the call, so the latency includes it.
  void CancelCalled(size_t job) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_called_[job] = Clock::now();
  }
  // Waits until `count` streams opened (or ended), up to `timeout`.
  void WaitOpened(int64_t count, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, timeout, [&] { return opened_ + ended_ >= count; });
  }
  bool WaitEnded(int64_t count, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return ended_ >= count; });
  }
  Clock::time_point last_open() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_open_;
  }
  int64_t opened() {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Clock::time_point> cancel_called_;
  Clock::time_point last_open_;
  int64_t opened_ = 0;
  int64_t ended_ = 0;
};

// One WatchJob stream on the client's async API: all of them share one completion queue and the
// thread that drains it (the callback API's idle threads stall for 100 ms a second in gRPC 1.51,
// which would show up as fan-out latency here).
class Watcher {
 public:
  Watcher(size_t job, Tally* tally, WatchLoadResult* result)
      : job_(job), tally_(tally), result_(result) {}

  void Start(v1::JobService::Stub* stub, const rpc::ClientOptions& client,
             const std::string& job_id, grpc::CompletionQueue* queue) {
    rpc::PrepareCall(&context_, client, std::chrono::milliseconds(0));  // no deadline: it waits
    request_.set_job_id(job_id);
    reader_ = stub->PrepareAsyncWatchJob(&context_, request_, queue);
    reader_->StartCall(&started_);
  }
  void Cancel() { context_.TryCancel(); }

 private:
  struct Tag {
    Watcher* watcher;
    void (Watcher::*on)(bool);
  };
  friend void Drain(grpc::CompletionQueue* queue);

  void OnStarted(bool ok) {
    if (!ok) return Finish();
    reader_->Read(&event_, &read_);
  }
  void OnRead(bool ok) {
    if (!ok) return Finish();
    if (!opened_) {
      opened_ = true;  // the snapshot comes first
      tally_->Opened();
    } else if (event_.has_state_change() && event_.state_change().to() == v1::JOB_STATE_CANCELLED) {
      tally_->SawCancel(job_, result_);
    }
    reader_->Read(&event_, &read_);
  }
  void Finish() { reader_->Finish(&status_, &finished_); }
  void OnFinished(bool) { tally_->Ended(status_, result_); }

  const size_t job_;
  Tally* const tally_;
  WatchLoadResult* const result_;
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobEvent event_;
  grpc::Status status_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::JobEvent>> reader_;
  bool opened_ = false;
  Tag started_{this, &Watcher::OnStarted};
  Tag read_{this, &Watcher::OnRead};
  Tag finished_{this, &Watcher::OnFinished};
};

// Runs the watchers' completions until the queue is shut down.
void Drain(grpc::CompletionQueue* queue) {
  void* tag;
  bool ok;
  while (queue->Next(&tag, &ok)) {
    auto* t = static_cast<Watcher::Tag*>(tag);
    (t->watcher->*(t->on))(ok);
  }
}

}  // namespace

void RunWatchLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                  const rpc::ClientOptions& client, const v1::JobSpec& spec,
                  const WatchLoadOptions& options, const std::function<void()>& when_open,
                  WatchLoadResult* result) {
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (const auto& channel : channels) stubs.push_back(v1::JobService::NewStub(channel));
  std::vector<std::string> job_ids;
  for (int j = 0; j < options.jobs; ++j) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.mutable_spec()->set_name(absl::StrCat("watch-", options.run_id, "-", j));
    request.mutable_resources()->set_ranks(1);
    request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_GPU);  // never placed
    grpc::ClientContext context;
    rpc::PrepareCall(&context, client);
    v1::Job job;
    const grpc::Status status = stubs[0]->SubmitJob(&context, request, &job);
    if (!status.ok()) {
      ++result->failed;
      result->first_error =
          absl::StrCat("SubmitJob: code ", status.error_code(), ": ", status.error_message());
      return;
    }
    job_ids.push_back(job.id());
  }

  Tally tally(job_ids.size());
  grpc::CompletionQueue queue;
  std::thread drain([&] { Drain(&queue); });
  std::vector<std::unique_ptr<Watcher>> watchers;
  const auto start = Clock::now();
  for (int64_t w = 0; w < options.watchers; ++w) {
    const size_t job = static_cast<size_t>(w) % job_ids.size();
    watchers.push_back(std::make_unique<Watcher>(job, &tally, result));
    watchers.back()->Start(stubs[static_cast<size_t>(w) % stubs.size()].get(), client, job_ids[job],
                           &queue);
  }
  tally.WaitOpened(options.watchers, kOpenTimeout);
  result->opened = tally.opened();
  result->open_seconds = std::chrono::duration<double>(tally.last_open() - start).count();
  when_open();

  for (size_t j = 0; j < job_ids.size(); ++j) {
    grpc::ClientContext context;
    rpc::PrepareCall(&context, client);
    v1::CancelJobRequest request;
    request.set_job_id(job_ids[j]);
    v1::Job job;
    tally.CancelCalled(j);
    const grpc::Status status = stubs[j % stubs.size()]->CancelJob(&context, request, &job);
    if (!status.ok() && result->first_error.empty()) {
      result->first_error =
          absl::StrCat("CancelJob: code ", status.error_code(), ": ", status.error_message());
    }
  }
  if (!tally.WaitEnded(options.watchers, kEndTimeout)) {
    for (auto& watcher : watchers) watcher->Cancel();  // the rest end as failed
    tally.WaitEnded(options.watchers, kEndTimeout);
  }
  queue.Shutdown();
  drain.join();
}

}  // namespace hyscale::bench
