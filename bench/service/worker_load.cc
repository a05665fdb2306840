#include "bench/service/worker_load.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "bench/service/load_client.h"
#include "hyscale/v1/service.grpc.pb.h"

namespace hyscale::bench {
namespace {

// Runs actions at their times on one thread. Actions only start asynchronous calls, so one
// thread keeps up with thousands of workers.
class TimerQueue {
 public:
  TimerQueue() : thread_([this] { Loop(); }) {}
  ~TimerQueue() { Stop(); }

  void At(Clock::time_point when, std::function<void()> action) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    queue_.push({when, next_++, std::move(action)});
    wake_.notify_one();
  }

  // Drops what has not run yet and joins the thread.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      wake_.notify_one();
    }
    thread_.join();
  }

 private:
  struct Entry {
    Clock::time_point when;
    int64_t order;  // FIFO among equal times
    std::function<void()> action;
    bool operator>(const Entry& other) const {
      return std::tie(when, order) > std::tie(other.when, other.order);
    }
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      if (queue_.empty()) {
        wake_.wait(lock);
        continue;
      }
      if (Clock::now() < queue_.top().when) {
        wake_.wait_until(lock, queue_.top().when);
        continue;
      }
      auto action = std::move(const_cast<Entry&>(queue_.top()).action);
      queue_.pop();
      lock.unlock();
      action();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  int64_t next_ = 0;
  bool stopped_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

struct SimWorker {
  std::string id;
  size_t channel = 0;
  std::mutex mu;
  std::vector<v1::RankRef> running;

  void Remove(const v1::RankRef& ref) {
    std::lock_guard<std::mutex> lock(mu);
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [&](const v1::RankRef& r) {
                                   return r.job_id() == ref.job_id() && r.rank() == ref.rank() &&
                                          r.attempt() == ref.attempt();
                                 }),
                  running.end());
  }
};

// A unary call through gRPC's callback API: what must outlive it, and when it was sent.
template <typename Request, typename Response>
struct UnaryCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  Clock::time_point start;
};

// When a job's scheduling became visible to the benchmark.
struct JobTimes {
  Clock::time_point submitted;
  std::optional<Clock::time_point> answered_scheduled;  // SubmitJob said SCHEDULED
  std::optional<Clock::time_point> delivered;           // its RunRank arrived
};

class WorkerLoad;

// One worker's assignment stream, read with gRPC's callback API (no thread per stream).
class AssignmentReader final : public grpc::ClientReadReactor<v1::Assignment> {
 public:
  AssignmentReader(WorkerLoad* load, SimWorker* worker) : load_(load), worker_(worker) {}

  void Start(v1::WorkerService::Stub* stub, const rpc::ClientOptions& client,
             std::chrono::milliseconds deadline) {
    rpc::PrepareCall(&context_, client, deadline);
    request_.set_worker_id(worker_->id);
    stub->async()->StreamAssignments(&context_, &request_, this);
    StartRead(&assignment_);
    StartCall();
  }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  void Cancel() { context_.TryCancel(); }
  void WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }

 private:
  WorkerLoad* const load_;
  SimWorker* const worker_;
  grpc::ClientContext context_;
  v1::StreamAssignmentsRequest request_;
  v1::Assignment assignment_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
};

class WorkerLoad {
 public:
  WorkerLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
             const rpc::ClientOptions& client, const v1::JobSpec& spec,
             const WorkerLoadOptions& options, WorkerLoadResult* result)
      : client_(client), spec_(spec), options_(options), result_(result) {
    for (const auto& channel : channels) {
      worker_stubs_.push_back(v1::WorkerService::NewStub(channel));
      job_stubs_.push_back(v1::JobService::NewStub(channel));
    }
    for (int i = 0; i < options.workers; ++i) {
      auto worker = std::make_unique<SimWorker>();
      worker->id = absl::StrCat("load-", options.run_id, "-w", i);
      worker->channel = i % channels.size();
      workers_.push_back(std::move(worker));
    }
  }

  void Run();
  void OnAssignment(SimWorker* worker, const v1::Assignment& assignment);
  void OnStreamDone(const grpc::Status& status);

 private:
  void RegisterAll();
  void Heartbeat(SimWorker* worker, Clock::time_point due);
  void Report(SimWorker* worker, v1::RankReport report);
  void Submit(int64_t index);
  void Collect();
  void Fail(std::atomic<int64_t>& counter, const std::string& what, const grpc::Status& status);
  bool stopping() const { return stopping_.load(); }

  // Stamps the call's start and sends it with `send(context, request, response, on_done)` (a
  // stub's async() method); `done(status)` runs when it completes, and the call counts as in
  // flight until then.
  template <typename Call, typename SendFn, typename DoneFn>
  void StartCall(const std::shared_ptr<Call>& call, SendFn send, DoneFn done) {
    rpc::PrepareCall(&call->context, client_);
    call->start = Clock::now();
    in_flight_.Begin();
    send(&call->context, &call->request, &call->response,
         [this, call, done = std::move(done)](grpc::Status status) {
           done(status);
           in_flight_.End();
         });
  }

  const rpc::ClientOptions client_;
  const v1::JobSpec spec_;
  const WorkerLoadOptions options_;
  WorkerLoadResult* const result_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> worker_stubs_;
  std::vector<std::unique_ptr<v1::JobService::Stub>> job_stubs_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::vector<std::unique_ptr<AssignmentReader>> readers_;
  std::chrono::milliseconds interval_{1000};
  std::atomic<bool> stopping_{false};
  std::atomic<Clock::time_point> window_start_{Clock::time_point::max()};
  InFlight in_flight_;

  std::mutex jobs_mu_;
  std::unordered_map<std::string, JobTimes> jobs_;  // by job name (RunRank carries the spec)

  std::atomic<int64_t> heartbeats_failed_{0}, heartbeats_unregistered_{0}, reports_failed_{0},
      submitted_{0}, submit_failed_{0}, placed_at_submit_{0}, streams_failed_{0},
      stops_received_{0};
  std::mutex error_mu_;
  TimerQueue timers_;  // last: stopped (joined) before the members its actions use go away
};

void AssignmentReader::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended: OnDone follows
  load_->OnAssignment(worker_, assignment_);
  StartRead(&assignment_);
}

void AssignmentReader::OnDone(const grpc::Status& status) {
  load_->OnStreamDone(status);
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  done_cv_.notify_all();
}

void WorkerLoad::Fail(std::atomic<int64_t>& counter, const std::string& what,
                      const grpc::Status& status) {
  ++counter;
  std::lock_guard<std::mutex> lock(error_mu_);
  if (result_->first_error.empty()) {
    result_->first_error =
        absl::StrCat(what, ": code ", status.error_code(), ": ", status.error_message());
  }
}

void WorkerLoad::RegisterAll() {
  std::atomic<size_t> next{0};
  std::atomic<int64_t> failed{0};
  std::atomic<int64_t> interval_ms{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < options_.register_threads; ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < workers_.size(); i = next++) {
        SimWorker& worker = *workers_[i];
        v1::RegisterWorkerRequest request;
        request.set_name(worker.id);
        request.set_address("127.0.0.1");
        v1::Device* device = request.add_devices();
        device->set_name("cpu");
        device->set_kind(v1::DEVICE_KIND_CPU);
        device->set_memory_bytes(int64_t{64} << 30);
        device->set_count(options_.slots);
        grpc::ClientContext context;
        rpc::PrepareCall(&context, client_);
        v1::RegisterWorkerResponse response;
        const auto start = Clock::now();
        const grpc::Status status =
            worker_stubs_[worker.channel]->RegisterWorker(&context, request, &response);
        if (!status.ok()) {
          Fail(failed, "RegisterWorker", status);
          continue;
        }
        result_->register_latency.AddSince(start);
        interval_ms = response.heartbeat_interval_ms();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  result_->register_failed = failed;
  result_->registered = static_cast<int64_t>(workers_.size()) - failed;
  if (interval_ms > 0) interval_ = std::chrono::milliseconds(interval_ms.load());
  result_->heartbeat_interval_ms = interval_.count();
}

void WorkerLoad::Heartbeat(SimWorker* worker, Clock::time_point due) {
  if (stopping()) return;
  auto call = std::make_shared<UnaryCall<v1::HeartbeatRequest, v1::HeartbeatResponse>>();
  call->request.set_worker_id(worker->id);
  {
    std::lock_guard<std::mutex> lock(worker->mu);
    for (const auto& ref : worker->running) *call->request.add_running() = ref;
  }
  auto* stub = worker_stubs_[worker->channel].get();
  StartCall(
      call, [stub](auto... args) { stub->async()->Heartbeat(args...); },
      [this, worker, call](const grpc::Status& status) {
        if (!status.ok()) {
          Fail(heartbeats_failed_, "Heartbeat", status);
        } else {
          const bool steady = call->start >= window_start_.load();
          (steady ? result_->heartbeat : result_->first_heartbeats).AddSince(call->start);
          if (!call->response.registered()) ++heartbeats_unregistered_;
          for (const auto& ref : call->response.stop()) {
            ++stops_received_;
            worker->Remove(ref);
          }
        }
      });
  // Fixed rate, like a steady agent: the next beat is due one interval after this one was.
  const auto next = due + interval_;
  timers_.At(next, [this, worker, next] { Heartbeat(worker, next); });
}

void WorkerLoad::Report(SimWorker* worker, v1::RankReport report) {
  if (stopping()) return;
  auto call = std::make_shared<UnaryCall<v1::ReportStatusRequest, v1::ReportStatusResponse>>();
  call->request.set_worker_id(worker->id);
  *call->request.add_reports() = std::move(report);
  auto* stub = worker_stubs_[worker->channel].get();
  StartCall(
      call, [stub](auto... args) { stub->async()->ReportStatus(args...); },
      [this, call](const grpc::Status& status) {
        if (status.ok()) {
          result_->report.AddSince(call->start);
        } else {
          Fail(reports_failed_, "ReportStatus", status);
        }
      });
}

void WorkerLoad::OnAssignment(SimWorker* worker, const v1::Assignment& assignment) {
  if (assignment.has_stop()) {
    ++stops_received_;
    worker->Remove(assignment.stop().ref());
    v1::RankReport report;
    *report.mutable_ref() = assignment.stop().ref();
    report.mutable_exited()->set_exit_code(-1);
    report.mutable_exited()->set_signal(15);
    Report(worker, std::move(report));
    return;
  }
  if (!assignment.has_run()) return;
  const auto now = Clock::now();
  const v1::RankRef ref = assignment.run().ref();
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    const auto found = jobs_.find(assignment.run().spec().name());
    if (found != jobs_.end() && !found->second.delivered) found->second.delivered = now;
  }
  {
    std::lock_guard<std::mutex> lock(worker->mu);
    worker->running.push_back(ref);
  }
  v1::RankReport started;
  *started.mutable_ref() = ref;
  started.set_started_pid(100000 + ref.rank());
  Report(worker, std::move(started));
  timers_.At(now + std::chrono::milliseconds(options_.job_ms), [this, worker, ref] {
    worker->Remove(ref);
    v1::RankReport exited;
    *exited.mutable_ref() = ref;
    exited.mutable_exited()->set_exit_code(0);
    Report(worker, std::move(exited));
  });
}

void WorkerLoad::OnStreamDone(const grpc::Status& status) {
  // Cancelled by us at the end of the phase; anything else ended it early.
  if (!stopping() || status.error_code() != grpc::StatusCode::CANCELLED) {
    Fail(streams_failed_, "StreamAssignments", status);
  }
}

void WorkerLoad::Submit(int64_t index) {
  auto call = std::make_shared<UnaryCall<v1::SubmitJobRequest, v1::Job>>();
  const std::string name = absl::StrCat("load-", options_.run_id, "-b", index);
  *call->request.mutable_spec() = spec_;
  call->request.mutable_spec()->set_name(name);
  call->request.mutable_resources()->set_ranks(1);
  call->request.mutable_resources()->set_device_kind(v1::DEVICE_KIND_CPU);
  call->request.set_request_id(name);
  auto* stub = job_stubs_[index % job_stubs_.size()].get();
  StartCall(
      call,
      [this, stub, call, name](auto... args) {
        // The job's entry exists before its answer can come back to complete or erase it.
        {
          std::lock_guard<std::mutex> lock(jobs_mu_);
          jobs_[name].submitted = call->start;
        }
        ++submitted_;
        stub->async()->SubmitJob(args...);
      },
      [this, call, name](const grpc::Status& status) {
        const auto now = Clock::now();
        if (!status.ok()) {
          Fail(submit_failed_, "SubmitJob", status);
          std::lock_guard<std::mutex> lock(jobs_mu_);
          jobs_.erase(name);
        } else {
          result_->submit.Add(now - call->start);
          const v1::JobState state = call->response.state();
          if (state != v1::JOB_STATE_PENDING) {
            ++placed_at_submit_;
            std::lock_guard<std::mutex> lock(jobs_mu_);
            jobs_[name].answered_scheduled = now;
          }
        }
      });
}

void WorkerLoad::Run() {
  RegisterAll();
  const auto stream_deadline = std::chrono::milliseconds(
      static_cast<int64_t>(options_.duration_s * 1000) + 10 * interval_.count() + 60'000);
  const auto start = Clock::now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    SimWorker* worker = workers_[i].get();
    readers_.push_back(std::make_unique<AssignmentReader>(this, worker));
    readers_.back()->Start(worker_stubs_[worker->channel].get(), client_, stream_deadline);
    // Beats spread evenly over one interval, as independent agents' would be.
    const auto due = start + interval_ * i / workers_.size();
    timers_.At(due, [this, worker, due] { Heartbeat(worker, due); });
  }
  // Warm-up: every worker has beaten twice and its stream is open before the measurement.
  std::this_thread::sleep_for(2 * interval_);

  const auto window_start = Clock::now();
  window_start_ = window_start;
  const auto window_end = window_start + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options_.duration_s));
  for (int64_t i = 0;; ++i) {
    const auto due = window_start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(i / options_.job_rate));
    if (due >= window_end) break;
    std::this_thread::sleep_until(due);
    Submit(i);
  }
  result_->seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
  // Time for the last submissions' RunRanks to arrive.
  std::this_thread::sleep_for(
      std::min<std::chrono::milliseconds>(interval_ * 2, std::chrono::seconds(5)));
  stopping_ = true;
  timers_.Stop();
  for (auto& reader : readers_) reader->Cancel();
  for (auto& reader : readers_) reader->WaitDone();
  in_flight_.Wait();
  Collect();
}

void WorkerLoad::Collect() {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  for (const auto& [name, times] : jobs_) {
    std::optional<Clock::time_point> scheduled = times.answered_scheduled;
    if (times.delivered && (!scheduled || *times.delivered < *scheduled)) {
      scheduled = times.delivered;
    }
    if (!scheduled) {
      ++result_->never_scheduled;
      continue;
    }
    result_->scheduled.Add(*scheduled - times.submitted);
    if (times.delivered) result_->delivered.Add(*times.delivered - times.submitted);
  }
  result_->heartbeats_failed = heartbeats_failed_;
  result_->heartbeats_unregistered = heartbeats_unregistered_;
  result_->reports_failed = reports_failed_;
  result_->submitted = submitted_;
  result_->submit_failed = submit_failed_;
  result_->placed_at_submit = placed_at_submit_;
  result_->streams_failed = streams_failed_;
  result_->stops_received = stops_received_;
}

}  // namespace

void RunWorkerLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                   const rpc::ClientOptions& client, const v1::JobSpec& spec,
                   const WorkerLoadOptions& options, WorkerLoadResult* result) {
  WorkerLoad load(channels, client, spec, options, result);
  load.Run();
}

}  // namespace hyscale::bench
