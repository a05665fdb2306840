#include "bench/service/load_client.h"

#include <absl/strings/str_cat.h>

#include "proto/job_spec.h"

namespace hyscale::bench {
namespace {

// d_model 32, one layer, 64 tokens: valid and cheap, never actually trained by the benchmark.
constexpr char kSpecJson[] = R"({
  "seed": 1,
  "model": {"vocab_size": 64, "d_model": 32, "layers": 1, "heads": 2, "head_dim_qk": 16,
            "rope_dim": 8, "head_dim_v": 16, "d_ff": 64,
            "indexer": {"heads": 2, "dim": 16, "rope_dim": 8, "topk": 16}},
  "data": {"seq_len": 64, "batch_size": 2,
           "recall": {"pairs": 4, "queries": 4, "key_vocab": 16, "value_vocab": 16}},
  "stages": [{"steps": 20, "lr": 0.003}],
  "checkpoint": {"every_steps": 5}
})";

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> OpenChannels(
    const rpc::ClientOptions& options, int count) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    auto roots = rpc::ReadFile(options.tls_ca_file);
    if (!roots.ok()) return roots.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *roots;
    credentials = grpc::SslCredentials(ssl);
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(options.server, credentials, arguments);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + options.timeout)) {
      return absl::UnavailableError(absl::StrCat("cannot connect to ", options.server, " within ",
                                                 options.timeout.count(), " ms"));
    }
    channels.push_back(std::move(channel));
  }
  return channels;
}

absl::StatusOr<v1::JobSpec> BenchSpec() {
  return ParseJobSpec(kSpecJson, SpecFormat::kJson);
}

void InFlight::Begin() {
  std::lock_guard<std::mutex> lock(mu_);
  ++count_;
}

void InFlight::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--count_ == 0) idle_.notify_all();
}

void InFlight::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return count_ == 0; });
}

}  // namespace hyscale::bench
