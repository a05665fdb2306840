#include "client/cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>

#include "client/commands/commands.h"
#include "client/exit_codes.h"

namespace hyscale::cli {
namespace {

constexpr char kDefaultServer[] = "127.0.0.1:50051";

// Flags shared by submit, plan and up -f.
void AddResourceFlags(CLI::App* command, int* ranks, std::string* device) {
  command->add_option("--ranks", *ranks, "Trainer processes, one device each")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--device", *device, "Device kind per rank: cpu, gpu or any")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu", "any"}));
}

void AddSubmitFlags(CLI::App* command, SubmitArgs* args) {
  AddResourceFlags(command, &args->ranks, &args->device);
  command->add_option("--priority", args->priority, "Higher runs first")->capture_default_str();
  command
      ->add_option("--max-restarts", args->max_restarts,
                   "Restarts from the last checkpoint before the job fails")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           Terminal terminal) {
  CLI::App app{"hyscale: submit and follow DSA sparse-attention training jobs on HyScale"};
  app.name("hyscale");
  app.footer(kExitCodeHelp);
  app.require_subcommand(1);
  app.fallthrough();

  std::string server, token, token_file, tls_ca, output = "table";
  double timeout_seconds = 10;
  app.add_option("--server", server, "Coordinator host:port (env HYSCALE_SERVER)")
      ->envname("HYSCALE_SERVER")
      ->default_str(kDefaultServer);
  app.add_option("--token", token, "Bearer token (else --token-file, else env HYSCALE_TOKEN)");
  app.add_option("--token-file", token_file, "File holding the bearer token");
  app.add_option("--tls-ca", tls_ca, "PEM CA certificates: connect with TLS");
  app.add_option("-o,--output", output, "Output: table (for people) or json (protobuf JSON)")
      ->capture_default_str()
      ->check(CLI::IsMember({"table", "json"}));
  app.add_option("--timeout", timeout_seconds, "Seconds to wait for each call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  SubmitArgs submit;
  CLI::App* submit_command = app.add_subcommand("submit", "Submit a job");
  submit_command->add_option("-f,--file", submit.file, "Job spec (.yaml, .yml or .json)")
      ->required();
  AddSubmitFlags(submit_command, &submit);
  submit_command->add_option("--request-id", submit.request_id,
                             "Idempotency key: a retry with the same id returns the same job "
                             "(default: random)");
  submit_command->add_flag("--watch", submit.watch, "Follow the job until it ends");

  std::vector<std::string> states;
  CLI::App* list_command = app.add_subcommand("list", "List jobs, newest first");
  list_command->add_option("--state", states, "Only jobs in this state (repeatable)");

  std::string job_id, reason;
  CLI::App* get_command = app.add_subcommand("get", "Show one job");
  get_command->add_option("id", job_id, "Job id")->required();

  CLI::App* cancel_command = app.add_subcommand("cancel", "Cancel a job");
  cancel_command->add_option("id", job_id, "Job id")->required();
  cancel_command->add_option("--reason", reason, "Why (kept on the job)");

  CLI::App* watch_command =
      app.add_subcommand("watch", "Follow a job's progress; exits with its outcome");
  watch_command->add_option("id", job_id, "Job id")->required();

  LogsArgs logs;
  CLI::App* logs_command = app.add_subcommand("logs", "Print a rank's trainer log");
  logs_command->add_option("id", logs.job_id, "Job id")->required();
  logs_command->add_option("--rank", logs.rank, "Rank")->capture_default_str();
  logs_command->add_flag("-f,--follow", logs.follow, "Keep printing until the job ends");

  CLI::App* workers_command = app.add_subcommand("workers", "List workers and their devices");

  PlanArgs plan;
  CLI::App* plan_command =
      app.add_subcommand("plan", "Show how a job would be laid out and what it would cost");
  plan_command->add_option("file,-f,--file", plan.file, "Job spec (.yaml, .yml or .json)")
      ->required();
  AddResourceFlags(plan_command, &plan.ranks, &plan.device);
  plan_command
      ->add_option("--gpus", plan.gpus,
                   "Plan offline (no coordinator) for this many devices: the candidate table")
      ->check(CLI::Range(1, 1024));
  plan_command
      ->add_option("--gpu", plan.gpu, "Device profile offline: h200 (default), h800, h20, cpu")
      ->check(CLI::IsMember({"h200", "h800", "h20", "cpu"}));
  plan_command->add_option("--calibration", plan.calibration,
                           "Micro-benchmark JSON whose figures replace the profile's (offline)");
  plan_command->add_option(
      "--key-sharing", plan.key_sharing,
      "The job's measured key sharing, G=ratio,.. (its evaluations' key_sharing; offline): "
      "replaces the profile's dedup for those G");
  plan_command->add_option("--top", plan.top, "Feasible candidates shown (offline); 0: all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  plan_command->add_flag("--sources", plan.sources,
                         "List each profile figure and where it comes from (offline)");
  plan_command
      ->add_option("--stack", plan.stack,
                   "Whose kernels (offline): hyscale, megatron (score table + topk, gather "
                   "attention, re-selection), or megatron-naive (the same with fp32 einsum "
                   "selection over whole rows)")
      ->capture_default_str()
      ->check(CLI::IsMember({"hyscale", "megatron", "megatron-naive"}));

  UpArgs up;
  int64_t start_timeout_seconds = up.start_timeout.count();
  CLI::App* up_command = app.add_subcommand(
      "up", "Run a local coordinator and worker; with -f run that job to the end");
  up_command->add_option("--data-dir", up.data_dir, "Coordinator data and worker files")
      ->capture_default_str();
  up_command->add_option("-f,--file", up.file,
                         "Job to run, then stop (default: serve until Ctrl-C)");
  AddSubmitFlags(up_command, &up.submit);
  up_command->add_option("--worker-name", up.worker_name, "Name of the local worker")
      ->capture_default_str();
  up_command->add_option("--devices", up.devices, "The worker's devices, e.g. cpu:2");
  up_command->add_option("--trainer", up.trainer, "hyscale-train binary for the worker");
  up_command->add_option(
      "--run-as", up.run_as,
      "User the worker runs trainers as (as root: nobody, or root where nobody cannot "
      "reach the build or the data folder)");
  up_command->add_option("--metrics-listen", up.metrics_listen,
                         "Coordinator's /metrics address (default: hyscaled's)");
  up_command
      ->add_option("--start-timeout", start_timeout_seconds,
                   "Seconds to wait for the coordinator and worker to come up")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kExitOk : kExitUsage;
  }

  Context context;
  context.out = &out;
  context.err = &err;
  context.terminal = terminal.is_terminal;
  context.terminal_columns = terminal.columns;
  context.output = output == "json" ? OutputFormat::kJson : OutputFormat::kTable;
  auto resolved_token = rpc::ResolveToken(token, token_file, "HYSCALE_TOKEN");
  if (!resolved_token.ok()) return Fail(context, "token", resolved_token.status());
  context.client.server = server.empty() ? kDefaultServer : server;
  context.client.token = *resolved_token;
  context.client.tls_ca_file = tls_ca;
  context.client.timeout =
      std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_seconds * 1000)));

  if (*submit_command) return Submit(context, submit);
  if (*list_command) return List(context, states);
  if (*get_command) return Get(context, job_id);
  if (*cancel_command) return Cancel(context, job_id, reason);
  if (*watch_command) return Watch(context, job_id);
  if (*logs_command) return Logs(context, logs);
  if (*workers_command) return Workers(context);
  if (*plan_command) return Plan(context, plan);
  if (*up_command) {
    up.start_timeout = std::chrono::seconds(start_timeout_seconds);
    up.submit.file = up.file;
    return Up(context, up);
  }
  return kExitUsage;
}

}  // namespace hyscale::cli
