// The worker agent: registers this machine's devices with the coordinator, heartbeats, runs the
// ranks the coordinator assigns as trainer processes and reports what they do.
//
// The coordinator may go away at any time (restart, network). The agent then keeps its trainers
// running, retries with exponential backoff and jitter, registers again listing the ranks still
// running (so the coordinator re-adopts them instead of starting them twice) and delivers the
// reports it could not send, in order.
#pragma once

#include <absl/status/status.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hyscale/v1/service.grpc.pb.h"
#include "proto/rpc.h"
#include "util/subprocess.h"
#include "worker/agent/backoff.h"
#include "worker/agent/report_queue.h"
#include "worker/agent/trainer_process.h"

namespace hyscale::agent {

struct AgentOptions {
  rpc::ClientOptions client;  // coordinator address, token, TLS, unary deadline
  std::string name;           // the worker id
  std::string address;        // host for rendezvous
  std::vector<v1::Device> devices;
  std::string work_dir;
  std::string trainer_path;
  // Where jobs may read data files (none given: <work_dir>/data) and write checkpoints (none
  // given: <work_dir>); see JobPaths.
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
  std::optional<util::RunAs> run_as;  // the trainers' user; none: the agent's
  // Until the coordinator says otherwise in RegisterWorkerResponse.
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds stop_grace{10000};   // SIGTERM -> SIGKILL
  std::chrono::milliseconds report_linger{100};  // how long a report waits for others to batch
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{5000};
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Serves until Shutdown(): then stops every trainer, delivers what reports it can within a
  // deadline and returns. Errors only for a setup problem (e.g. a bad TLS CA file).
  absl::Status Run();

  // Thread-safe; Run() returns soon after.
  void Shutdown();

  // Ranks with a trainer process (running, or exited with the exit not yet delivered).
  std::vector<v1::RankRef> Running() const;

 private:
  using RankKey = std::tuple<std::string, int32_t, int32_t>;  // job, rank, attempt
  struct Rank {
    v1::RankRef ref;
    std::shared_ptr<TrainerProcess> process;  // shared: waited on outside the lock
  };

  static RankKey KeyOf(const v1::RankRef& ref);

  absl::Status Register();
  // Reads assignments until the stream ends; returns how long it was open.
  std::chrono::steady_clock::duration ServeAssignments();
  void HeartbeatLoop();
  void ReportLoop();

  void RunRank(const v1::RunRank& run);
  void StopRank(const v1::RankRef& ref, const std::string& reason);
  void Report(const v1::RankRef& ref, v1::RankReport report);
  // A batch was delivered: ranks whose exit it carried are done.
  void Delivered(const std::vector<v1::RankReport>& batch);
  // Forces a new registration (the coordinator forgot us or restarted).
  void Reconnect();
  // At the end of a clean shutdown, with no trainer left: a last heartbeat that tells the
  // coordinator this worker leaves (HeartbeatRequest.leaving), so its name is free at once.
  void Leave();
  void StopAllTrainers();
  // Sleeps up to `duration`, returning early (false) on shutdown.
  bool SleepFor(std::chrono::milliseconds duration);
  void PrepareCall(grpc::ClientContext* context) const;

  const AgentOptions options_;
  const JobPaths paths_;
  const std::string instance_;  // RegisterWorkerRequest.instance: this process's claim on the name
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  ReportQueue reports_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // shutdown, registration
  bool shutting_down_ = false;
  bool registered_ = false;
  bool reporter_done_ = false;  // the reporter stops: set after the shutdown drain
  std::string worker_id_;
  std::chrono::milliseconds heartbeat_interval_;
  grpc::ClientContext* stream_context_ = nullptr;    // the open assignment stream, for cancelling
  grpc::ClientContext* register_context_ = nullptr;  // a registration in flight, for cancelling
  std::map<RankKey, Rank> ranks_;
};

}  // namespace hyscale::agent
