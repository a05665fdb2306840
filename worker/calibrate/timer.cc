#include "worker/calibrate/timer.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "worker/calibrate/device.h"

#ifdef HYSCALE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace hyscale::calibrate {

Timer::Timer(c10::Device device, int warmup, int runs)
    : device_(device), warmup_(warmup), runs_(runs) {}

double Timer::Median(const std::function<void()>& fn) const {
  for (int i = 0; i < warmup_; ++i) fn();
  Synchronize(device_);
  std::vector<double> seconds;
  for (int i = 0; i < runs_; ++i) seconds.push_back(Once(fn));
  std::sort(seconds.begin(), seconds.end());
  const size_t mid = seconds.size() / 2;
  return seconds.size() % 2 == 1 ? seconds[mid] : (seconds[mid - 1] + seconds[mid]) / 2;
}

double Timer::Once(const std::function<void()>& fn) const {
#ifdef HYSCALE_HAVE_CUDA
  if (device_.is_cuda()) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);  // timing enabled
    start.record();
    fn();
    end.record();
    end.synchronize();
    return start.elapsed_time(end) / 1e3;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  fn();
  Synchronize(device_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace hyscale::calibrate
