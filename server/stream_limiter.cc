#include "server/stream_limiter.h"

#include <absl/strings/str_cat.h>

namespace hyscale::server {

absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> StreamLimiter::Acquire(
    const std::string& peer) {
  const std::string host = peer.substr(0, peer.rfind(':'));
  std::lock_guard<std::mutex> lock(mu_);
  int& open = open_[host];
  if (open >= per_host_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("streams: ", per_host_,
                     " watch and log streams are open from this host already; close some"));
  }
  ++open;
  return std::make_unique<Slot>(this, host);
}

void StreamLimiter::Release(const std::string& host) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = open_.find(host);
  if (found != open_.end() && --found->second <= 0) open_.erase(found);
}

}  // namespace hyscale::server
