#include "server/trainer_events.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include "proto/events.h"

namespace hyscale::server {
namespace {

// A host name is at most 253 bytes; the rest is slack for the port.
constexpr size_t kMaxAddressBytes = 300;

}  // namespace

absl::StatusOr<v1::JobEvent> ParseTrainerEvent(int rank, std::string_view line) {
  auto parsed = ParseEventLine(line);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("event_json: ", parsed.status().message()));
  }
  v1::JobEvent event;
  event.mutable_trainer()->set_rank(rank);
  *event.mutable_trainer()->mutable_event() = *std::move(parsed);
  return event;
}

absl::StatusOr<std::string> RendezvousAddress(const v1::TrainerEventLine::Rendezvous& rendezvous) {
  const std::string& address = rendezvous.address();
  if (address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous event: address longer than ", kMaxAddressBytes, " bytes"));
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous event: address must be host:port with a port in 1..65535, got '",
                     address, "'"));
  }
  return address;
}

}  // namespace hyscale::server
