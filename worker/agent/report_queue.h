// The agent's outgoing rank reports, in the order they happened. A batch that could not be
// delivered goes back to the front, so after a reconnect reports arrive in order, once each.
// While the coordinator is away the queue is bounded: past `max_queued_bytes` new log chunks are
// dropped (the rank's log file keeps them), past twice that events too; started and exited
// reports are always kept, as the coordinator's bookkeeping depends on them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "hyscale/v1/service.pb.h"

namespace hyscale::agent {

class ReportQueue {
 public:
  // A batch holds at most `max_reports` reports and about `max_bytes` of payload.
  ReportQueue(size_t max_reports, size_t max_bytes, size_t max_queued_bytes);

  void Push(v1::RankReport report);

  // Waits until a report is queued (or `Close`), then up to `linger` more for others to join it,
  // and takes the oldest reports as one batch. Empty only after `Close` with nothing queued, or
  // when `wait` passes with nothing queued.
  std::vector<v1::RankReport> TakeBatch(std::chrono::milliseconds wait,
                                        std::chrono::milliseconds linger);

  // Puts an undelivered batch back in front of everything queued since.
  void PutBack(std::vector<v1::RankReport> batch);

  // Wakes TakeBatch; later calls return without waiting.
  void Close();

  size_t size() const;
  // Reports dropped so far because the queue was full.
  size_t dropped() const;

 private:
  const size_t max_reports_;
  const size_t max_bytes_;
  const size_t max_queued_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::RankReport> reports_;
  size_t queued_bytes_ = 0;
  size_t dropped_ = 0;
  bool closed_ = false;
};

}  // namespace hyscale::agent
