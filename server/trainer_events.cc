#include "server/trainer_events.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>

namespace hyscale::server {
namespace {

// A host name is at most 253 bytes; the rest is slack for the port.
constexpr size_t kMaxAddressBytes = 300;

// An integer field of a step event, 0 when absent. A float or a number outside [0, max] is refused:
// converting one to an integer is undefined behaviour (a trainer's line is untrusted input).
int64_t NonNegativeInteger(const nlohmann::json& json, const char* key, int64_t max) {
  if (!json.contains(key)) return 0;
  const auto& value = json[key];
  if (value.is_number_unsigned() && value.get<uint64_t>() <= static_cast<uint64_t>(max)) {
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= max) {
    return value.get<int64_t>();
  }
  throw std::invalid_argument(absl::StrCat("\"", key, "\" must be an integer in [0, ", max, "]"));
}

}  // namespace

absl::StatusOr<v1::JobEvent> ParseTrainerEvent(int rank, const std::string& line) {
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("event") || !json["event"].is_string()) {
    return absl::InvalidArgumentError("event_json: not a JSON object with a string \"event\"");
  }
  const std::string name = json["event"].get<std::string>();
  v1::JobEvent event;
  if (name != "step") {
    auto* trainer = event.mutable_trainer();
    trainer->set_rank(rank);
    trainer->set_event(name);
    trainer->set_json(line);
    return event;
  }
  try {
    auto* step = event.mutable_step();
    step->set_rank(rank);
    constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
    step->set_step(NonNegativeInteger(json, "step", kInt64Max));
    step->set_total_steps(NonNegativeInteger(json, "total_steps", kInt64Max));
    step->set_stage(static_cast<int32_t>(
        NonNegativeInteger(json, "stage", std::numeric_limits<int32_t>::max())));
    step->set_loss(json.value("loss", 0.0));
    step->set_lm_loss(json.value("lm_loss", 0.0));
    step->set_indexer_loss(json.value("indexer_loss", 0.0));
    step->set_lr(json.value("lr", 0.0));
    step->set_step_seconds(json.value("step_seconds", 0.0));
    step->set_tokens_per_second(json.value("tokens_per_second", 0.0));
    step->set_peak_memory_bytes(NonNegativeInteger(json, "peak_memory_bytes", kInt64Max));
    step->set_eta_seconds(json.value("eta_seconds", 0.0));
    if (json.contains("phase_seconds") && json["phase_seconds"].is_object()) {
      for (const auto& [phase, seconds] : json["phase_seconds"].items()) {
        if (seconds.is_number()) (*step->mutable_phase_seconds())[phase] = seconds.get<double>();
      }
    }
    if (json.contains("comm_exposed_seconds")) {
      step->set_comm_exposed_seconds(json["comm_exposed_seconds"].get<double>());
    }
    if (json.contains("comm_overlapped_seconds")) {
      step->set_comm_overlapped_seconds(json["comm_overlapped_seconds"].get<double>());
    }
    if (json.contains("accuracy") || json.contains("indexer_recall")) {
      step->set_evaluated(true);
      step->set_accuracy(json.value("accuracy", 0.0));
      step->set_indexer_recall(json.value("indexer_recall", 0.0));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(std::string("event_json: step event: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(std::string("event_json: step event: ") + e.what());
  }
  return event;
}

absl::StatusOr<std::string> RendezvousAddress(const std::string& line) {
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("address") || !json["address"].is_string()) {
    return absl::InvalidArgumentError("rendezvous event: no string \"address\"");
  }
  const std::string address = json["address"].get<std::string>();
  const size_t colon = address.rfind(':');
  int port = 0;
  if (address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous event: address longer than ", kMaxAddressBytes, " bytes"));
  }
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous event: address must be host:port with a port in 1..65535, got '",
                     address, "'"));
  }
  return address;
}

}  // namespace hyscale::server
