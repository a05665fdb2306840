#include "worker/parallel/c10d_communicator.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"

namespace hyscale::parallel {
namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

class C10dWork : public Work {
 public:
  C10dWork(std::string what, WaitMode mode, std::function<void()> then)
      : what_(std::move(what)), mode_(mode), then_(std::move(then)), launched_(Clock::now()) {}

  void start(const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
    try {
      work_ = launch();
      // The future completes on the backend's thread when the collective does: that moment,
      // not the end of wait(), is when communication finished.
      work_->getFuture()->addCallback([finished = finished_](c10::ivalue::Future&) {
        finished->store(Clock::now().time_since_epoch().count());
      });
    } catch (...) {
      launch_error_ = std::current_exception();
    }
  }

  absl::Status wait(std::chrono::milliseconds timeout) override {
    if (launch_error_)
      return absl::InternalError(absl::StrCat(what_, ": ", describe(launch_error_)));
    const auto start = Clock::now();
    try {
      if (mode_ == WaitMode::kPoll) {
        const auto deadline = start + timeout;
        while (!work_->isCompleted()) {
          if (Clock::now() > deadline) return timed_out(timeout);
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        work_->wait();
      } else if (!work_->wait(timeout)) {
        return timed_out(timeout);
      }
    } catch (const c10::Error& e) {
      // c10d's wait(timeout) reports its deadline as an error too.
      if (Clock::now() - start >= timeout) return timed_out(timeout);
      return absl::UnavailableError(absl::StrCat(what_, " failed: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(what_, " failed: ", e.what()));
    }
    if (then_) then_();
    return absl::OkStatus();
  }

  Clock::time_point launched_at() const override { return launched_; }
  std::optional<Clock::time_point> finished_at() const override {
    const auto ticks = finished_->load();
    if (ticks == 0) return std::nullopt;
    return Clock::time_point(Clock::duration(ticks));
  }

 private:
  absl::Status timed_out(std::chrono::milliseconds timeout) const {
    return absl::DeadlineExceededError(absl::StrCat(what_, " did not finish within ",
                                                    timeout.count(),
                                                    " ms: a peer rank is stuck or not calling it"));
  }

  std::string what_;
  WaitMode mode_;
  std::function<void()> then_;
  Clock::time_point launched_;
  std::shared_ptr<std::atomic<Clock::rep>> finished_ = std::make_shared<std::atomic<Clock::rep>>(0);
  c10::intrusive_ptr<c10d::Work> work_;
  std::exception_ptr launch_error_;
};

}  // namespace

std::unique_ptr<Work> C10dCommunicator::track(
    const char* collective, WaitMode mode,
    const std::function<c10::intrusive_ptr<c10d::Work>()>& launch,
    std::function<void()> then) const {
  auto work = std::make_unique<C10dWork>(
      absl::StrCat(backend_, " ", collective, " on rank ", rank_, " of ", world_size_), mode,
      std::move(then));
  work->start(launch);
  return work;
}

}  // namespace hyscale::parallel
