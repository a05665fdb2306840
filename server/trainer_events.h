// Reading the trainer's event lines (proto/events.h) as an agent forwards them.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>

#include "hyscale/v1/service.pb.h"

namespace hyscale::server {

// A JobEvent (job_id, sequence and time left unset) carrying one event line of `rank`.
// INVALID_ARGUMENT, naming the field, when the line is not a trainer event (ParseEventLine).
absl::StatusOr<v1::JobEvent> ParseTrainerEvent(int rank, std::string_view line);

// The address of a `rendezvous` event: "host:port" with a non-empty host and a port in 1..65535
// (the trainer's port 0 request resolved). INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> RendezvousAddress(const v1::TrainerEventLine::Rendezvous& rendezvous);

}  // namespace hyscale::server
