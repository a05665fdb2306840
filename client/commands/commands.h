// The hyscale subcommands. Each returns the process's exit code (client/exit_codes.h) and prints
// to the context's streams.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "client/context.h"

namespace hyscale::cli {

struct SubmitArgs {
  std::string file;
  int ranks = 1;
  std::string device = "any";
  int priority = 0;
  int max_restarts = 0;
  std::string request_id;  // empty: a random one
  bool watch = false;
};
// `on_submitted`, when given, learns the job's id as soon as the coordinator took it (before any
// watching).
int Submit(const Context& context, const SubmitArgs& args,
           const std::function<void(const std::string& job_id)>& on_submitted = {});

int List(const Context& context, const std::vector<std::string>& states);
int Get(const Context& context, const std::string& job_id);
int Cancel(const Context& context, const std::string& job_id, const std::string& reason);

// Follows the job until it ends; exits with its outcome (0 succeeded, 1 failed or cancelled).
int Watch(const Context& context, const std::string& job_id);
int WatchJob(const Context& context, v1::JobService::Stub& stub, const std::string& job_id);

struct LogsArgs {
  std::string job_id;
  int rank = 0;
  bool follow = false;
};
int Logs(const Context& context, const LogsArgs& args);

int Workers(const Context& context);

struct PlanArgs {
  std::string file;
  int ranks = 1;
  std::string device = "any";
  // Offline planning (no coordinator) when gpus, gpu or key_sharing is set: the candidate table on
  // `gpus` devices of profile `gpu` (default h200), figures replaced by `calibration` and
  // `key_sharing` when given, for `stack`'s kernels.
  int gpus = 0;
  std::string gpu;
  std::string calibration;
  std::string key_sharing;        // "G=ratio,..": the profile's dedup(G) replaced (offline)
  int top = 20;                   // feasible rows shown (and as many rejected); 0: all
  bool sources = false;           // also list each profile figure and where it comes from
  std::string stack = "hyscale";  // whose kernels offline: "hyscale", "megatron", "megatron-naive"
};
// With gpus/gpu/key_sharing: the local planner's candidate table and why the winner won; otherwise
// the coordinator's plan (PlanJob) with placement.
int Plan(const Context& context, const PlanArgs& args);

struct UpArgs {
  std::string data_dir = "./hyscale-data";
  std::string file;   // a job to run to the end; empty: serve until Ctrl-C
  SubmitArgs submit;  // ranks, device, priority, max restarts for `file`
  std::string worker_name = "local";
  std::string devices;  // the worker's --devices; empty: detect
  std::string trainer;  // the worker's --trainer; empty: its default
  std::string run_as;   // the worker's --run-as; empty: its default
  std::string metrics_listen;
  std::chrono::seconds start_timeout{30};
};
int Up(const Context& context, const UpArgs& args);

}  // namespace hyscale::cli
