// Reading the trainer's JSON-line events (worker/trainer/events.h) as forwarded by an agent.
#pragma once

#include <absl/status/statusor.h>

#include <string>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server {

// A JobEvent (job_id, sequence and time left unset) for one event line of `rank`: "step" lines
// become StepProgress, every other event a TrainerEvent carrying the line. INVALID_ARGUMENT when
// the line is not a JSON object with a string "event" or a step field has the wrong type.
absl::StatusOr<v1::JobEvent> ParseTrainerEvent(int rank, const std::string& line);

// The "address" of a `rendezvous` event line: "host:port" with a non-empty host and a port in
// 1..65535 (the trainer's port 0 request resolved). INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> RendezvousAddress(const std::string& line);

}  // namespace hyscale::server
