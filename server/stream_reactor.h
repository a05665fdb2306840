// Serves a StreamSource on gRPC's callback API: one message in flight at a time, no thread held
// while the stream waits (the source wakes it through the StreamWaker), so ten thousand watchers
// cost memory, not threads.
#pragma once

#include <absl/status/statusor.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "proto/rpc.h"
#include "server/stream_limiter.h"
#include "server/stream_source.h"
#include "server/stream_waker.h"

namespace hyscale::server {

template <typename Message>
class StreamReactor final : public grpc::ServerWriteReactor<Message> {
 public:
  // Serves `source`, or finishes at once with its error. `slot` (may be null) is held until the
  // call is done. The reactor deletes itself.
  static StreamReactor* Start(absl::StatusOr<std::unique_ptr<StreamSource<Message>>> source,
                              StreamWaker* waker,
                              std::unique_ptr<StreamLimiter::Slot> slot = nullptr) {
    auto* reactor = new StreamReactor(waker, std::move(slot));
    if (!source.ok()) {
      reactor->finished_ = true;
      reactor->Finish(rpc::ToGrpc(source.status()));
    } else {
      reactor->source_ = *std::move(source);
      reactor->Pump();
    }
    return reactor;
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) {  // the client is gone
        if (finished_) return;
        finished_ = true;
      }
    }
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client left the stream"));
      return;
    }
    Pump();
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A write in flight fails now and finishes the call from OnWriteDone.
      if (finished_ || writing_) return;
      finished_ = true;
    }
    this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client left the stream"));
  }

  void OnDone() override { Unref(); }

 private:
  StreamReactor(StreamWaker* waker, std::unique_ptr<StreamLimiter::Slot> slot)
      : waker_(waker), slot_(std::move(slot)) {}
  // The source goes first: its wakes may run until it is gone, and they use the members.
  ~StreamReactor() { source_.reset(); }

  // Writes what is ready, else pulls the source; returns once a write is in flight, the call is
  // finished, or the source will wake it.
  void Pump() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (finished_ || writing_) return;
      if (pulling_) {  // the puller pulls again when it is back
        pull_again_ = true;
        return;
      }
      if (next_ < ready_.size()) {
        in_flight_ = std::move(ready_[next_++]);
        writing_ = true;
        lock.unlock();
        this->StartWrite(&in_flight_);
        return;
      }
      if (end_) {
        finished_ = true;
        const grpc::Status status = rpc::ToGrpc(*end_);
        lock.unlock();
        this->Finish(status);
        return;
      }
      pulling_ = true;
      pull_again_ = false;
      lock.unlock();
      std::vector<Message> pulled;
      std::optional<absl::Status> end = source_->Pull(&pulled, [this] { Wake(); });
      lock.lock();
      pulling_ = false;
      ready_ = std::move(pulled);  // what was ready before is all written
      next_ = 0;
      if (end) end_ = std::move(end);
      if (ready_.empty() && !end_ && !pull_again_) return;  // until the source wakes it
    }
  }

  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || wake_posted_) return;
      wake_posted_ = true;
      ++refs_;
    }
    waker_->Post([this] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        wake_posted_ = false;
      }
      Pump();
      Unref();
    });
  }

  void Unref() {
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  StreamWaker* const waker_;
  const std::unique_ptr<StreamLimiter::Slot> slot_;
  std::mutex mu_;
  // Pulled and not yet written: ready_[next_..]. A vector, not a deque: an idle stream holds no
  // buffer (ten thousand of them are 6 MB less).
  std::vector<Message> ready_;
  size_t next_ = 0;
  Message in_flight_;
  std::optional<absl::Status> end_;
  bool writing_ = false;
  bool pulling_ = false;
  bool pull_again_ = false;
  bool wake_posted_ = false;
  bool finished_ = false;
  int refs_ = 1;  // gRPC's, until OnDone; and one per posted wake
  std::unique_ptr<StreamSource<Message>> source_;
};

}  // namespace hyscale::server
