#include "worker/agent/report_queue.h"

#include <utility>

namespace hyscale::agent {

ReportQueue::ReportQueue(size_t max_reports, size_t max_bytes, size_t max_queued_bytes)
    : max_reports_(max_reports), max_bytes_(max_bytes), max_queued_bytes_(max_queued_bytes) {}

void ReportQueue::Push(v1::RankReport report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t size = report.ByteSizeLong();
    const bool droppable =
        (report.has_log() && queued_bytes_ + size > max_queued_bytes_) ||
        (report.has_event_json() && queued_bytes_ + size > 2 * max_queued_bytes_);
    if (droppable) {
      ++dropped_;
      return;
    }
    queued_bytes_ += size;
    reports_.push_back(std::move(report));
  }
  cv_.notify_all();
}

std::vector<v1::RankReport> ReportQueue::TakeBatch(std::chrono::milliseconds wait,
                                                   std::chrono::milliseconds linger) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [this] { return closed_ || !reports_.empty(); })) return {};
  if (!closed_) {
    cv_.wait_for(lock, linger, [this] { return closed_ || reports_.size() >= max_reports_; });
  }
  std::vector<v1::RankReport> batch;
  size_t bytes = 0;
  while (!reports_.empty() && batch.size() < max_reports_ &&
         (batch.empty() || bytes + reports_.front().ByteSizeLong() <= max_bytes_)) {
    bytes += reports_.front().ByteSizeLong();
    queued_bytes_ -= reports_.front().ByteSizeLong();
    batch.push_back(std::move(reports_.front()));
    reports_.pop_front();
  }
  return batch;
}

void ReportQueue::PutBack(std::vector<v1::RankReport> batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
      queued_bytes_ += it->ByteSizeLong();
      reports_.push_front(std::move(*it));
    }
  }
  cv_.notify_all();
}

void ReportQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

size_t ReportQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_.size();
}

size_t ReportQueue::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace hyscale::agent
