// One server-streaming call on the StreamQueue: it waits for the method's next call, opens a
// StreamSource for it and writes what the source pulls, one message in flight, until the source
// ends, the client leaves or the server shuts down. Everything but Wake runs on the queue's
// thread; Wake (the source's, from any thread) re-arms the call through an alarm on the queue.
#pragma once

#include <absl/status/statusor.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "proto/rpc.h"
#include "server/stream_limiter.h"
#include "server/stream_queue.h"
#include "server/stream_source.h"

namespace hyscale::server {

// What a stream serves: its source, and the host slot it holds while it lasts (may be null).
template <typename Message>
struct OpenedStream {
  std::unique_ptr<StreamSource<Message>> source;
  std::unique_ptr<StreamLimiter::Slot> slot;
};

template <typename Request, typename Message>
class AsyncStreamCall {
 public:
  // The generated RequestX of the method, bound to its service.
  using RequestCall =
      std::function<void(grpc::ServerContext*, Request*, grpc::ServerAsyncWriter<Message>*,
                         grpc::ServerCompletionQueue*, void* tag)>;
  // Admits an accepted call and opens its stream, or says why not (the call ends with it).
  using Open =
      std::function<absl::StatusOr<OpenedStream<Message>>(grpc::ServerContext&, const Request&)>;

  // Waits for the method's next call; each accepted call waits for the next in its place.
  static void Listen(StreamQueue* queue, RequestCall request, Open open) {
    if (!queue->accepting()) return;
    auto* call = new AsyncStreamCall(queue, std::move(request), std::move(open));
    call->context_.AsyncNotifyWhenDone(&call->done_tag_);
    call->request_call_(&call->context_, &call->request_, &call->writer_, queue->queue(),
                        &call->accepted_tag_);
  }

 private:
  // A tag that calls back into its call.
  struct Tag final : QueueTag {
    Tag(AsyncStreamCall* call, void (AsyncStreamCall::*on)(bool)) : call(call), on(on) {}
    void Proceed(bool ok) override { (call->*on)(ok); }
    AsyncStreamCall* const call;
    void (AsyncStreamCall::*const on)(bool);
  };

  AsyncStreamCall(StreamQueue* queue, RequestCall request, Open open)
      : queue_(queue), request_call_(std::move(request)), open_(std::move(open)) {}

  void OnAccepted(bool ok) {
    if (!ok) {  // the server is shutting down: this call never started
      delete this;
      return;
    }
    Listen(queue_, request_call_, open_);
    auto opened = open_(context_, request_);
    if (!opened.ok()) {
      Finish(rpc::ToGrpc(opened.status()));
      return;
    }
    source_ = std::move(opened->source);
    slot_ = std::move(opened->slot);
    Pump();
  }

  // Writes what is ready, else pulls the source; returns once a write or the finish is in flight,
  // or the source will wake it.
  void Pump() {
    for (;;) {
      if (finishing_ || writing_) return;
      if (next_ < ready_.size()) {
        in_flight_ = std::move(ready_[next_++]);
        writing_ = true;
        writer_.Write(in_flight_, &written_tag_);
        return;
      }
      if (end_) {
        Finish(rpc::ToGrpc(*end_));
        return;
      }
      if (done_) {  // the client left while the stream waited
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client left the stream"));
        return;
      }
      ready_.clear();
      next_ = 0;
      {
        std::lock_guard<std::mutex> lock(wake_mu_);
        woken_early_ = false;
      }
      if (auto end = source_->Pull(&ready_, [this] { Wake(); })) end_ = std::move(end);
      if (!ready_.empty() || end_) continue;
      std::lock_guard<std::mutex> lock(wake_mu_);
      if (woken_early_) continue;  // woken while pulling: pull again
      waiting_ = true;
      return;
    }
  }

  // From the source, on any thread (under the coordinator's lock: only arms the alarm).
  void Wake() {
    std::lock_guard<std::mutex> lock(wake_mu_);
    if (!waiting_) {
      woken_early_ = true;
      return;
    }
    waiting_ = false;
    alarm_pending_ = true;
    alarm_.Set(queue_->queue(), gpr_now(GPR_CLOCK_MONOTONIC), &woken_tag_);
  }

  void OnWoken(bool) {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      alarm_pending_ = false;
    }
    if (done_ && finishing_) {
      MaybeDelete();
      return;
    }
    Pump();
  }

  void OnWritten(bool ok) {
    writing_ = false;
    if (!ok) {  // the client is gone
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client left the stream"));
      return;
    }
    Pump();
  }

  void Finish(const grpc::Status& status) {
    finishing_ = true;
    writer_.Finish(status, &finished_tag_);
  }

  void OnFinished(bool) {
    finished_ = true;
    MaybeDelete();
  }

  // The call is over: finished, or cancelled by the client or the server's shutdown.
  void OnDone(bool) {
    done_ = true;
    // A stream waiting for a wake stops (a pending alarm finds it finishing); a write in flight
    // fails and finishes it from OnWritten.
    if (!finishing_ && !writing_) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client left the stream"));
    }
    MaybeDelete();
  }

  void MaybeDelete() {
    if (!done_ || !finished_ || writing_) return;
    source_.reset();  // unsubscribes: no Wake starts after this
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      if (alarm_pending_) {
        alarm_.Cancel();  // OnWoken comes back here
        return;
      }
    }
    delete this;
  }

  StreamQueue* const queue_;
  const RequestCall request_call_;
  const Open open_;
  grpc::ServerContext context_;
  Request request_;
  grpc::ServerAsyncWriter<Message> writer_{&context_};
  Tag accepted_tag_{this, &AsyncStreamCall::OnAccepted};
  Tag written_tag_{this, &AsyncStreamCall::OnWritten};
  Tag finished_tag_{this, &AsyncStreamCall::OnFinished};
  Tag done_tag_{this, &AsyncStreamCall::OnDone};
  Tag woken_tag_{this, &AsyncStreamCall::OnWoken};

  std::unique_ptr<StreamSource<Message>> source_;
  std::unique_ptr<StreamLimiter::Slot> slot_;
  // Pulled and not yet written: ready_[next_..]. A vector, not a deque: an idle stream holds no
  // buffer.
  std::vector<Message> ready_;
  size_t next_ = 0;
  Message in_flight_;
  std::optional<absl::Status> end_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  bool done_ = false;

  std::mutex wake_mu_;  // Wake's state, shared with the source's threads
  grpc::Alarm alarm_;
  bool waiting_ = false;      // for a wake: the source will call Wake
  bool woken_early_ = false;  // Wake came while the source was being pulled
  bool alarm_pending_ = false;
};

// Serves `method`, a service's generated RequestX for a server-streaming method, on `queue`.
template <typename Request, typename Message, typename Service, typename Base>
void ListenForStream(StreamQueue* queue, Service* service,
                     void (Base::*method)(grpc::ServerContext*, Request*,
                                          grpc::ServerAsyncWriter<Message>*, grpc::CompletionQueue*,
                                          grpc::ServerCompletionQueue*, void*),
                     typename AsyncStreamCall<Request, Message>::Open open) {
  AsyncStreamCall<Request, Message>::Listen(
      queue,
      [service, method](grpc::ServerContext* context, Request* request,
                        grpc::ServerAsyncWriter<Message>* writer, grpc::ServerCompletionQueue* cq,
                        void* tag) { (service->*method)(context, request, writer, cq, cq, tag); },
      std::move(open));
}

}  // namespace hyscale::server
