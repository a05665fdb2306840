// One thread that runs the wake-ups of thread-less streams. A stream is woken under the
// coordinator's lock (an event stored, a log grown), where it cannot pull (pulling takes that
// lock); the pull runs here instead.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace hyscale::server {

class StreamWaker {
 public:
  StreamWaker();
  // Runs what was posted, then stops.
  ~StreamWaker();
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;

  void Post(std::function<void()> task);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace hyscale::server
