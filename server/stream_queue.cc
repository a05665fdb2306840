#include "server/stream_queue.h"

namespace hyscale::server {

void StreamQueue::Start() {
  thread_ = std::thread([this] {
    void* tag;
    bool ok;
    while (queue_->Next(&tag, &ok)) static_cast<QueueTag*>(tag)->Proceed(ok);
  });
}

StreamQueue::~StreamQueue() {
  queue_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: still drained, so nothing is left on it
    void* tag;
    bool ok;
    while (queue_->Next(&tag, &ok)) static_cast<QueueTag*>(tag)->Proceed(ok);
  }
}

}  // namespace hyscale::server
