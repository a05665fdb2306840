// Timing of one micro-benchmark: warm-up calls, then the median of timed calls (CUDA events on a
// GPU, so host overhead between calls is not counted; the steady clock on the CPU).
#pragma once

#include <c10/core/Device.h>

#include <functional>

namespace hyscale::calibrate {

class Timer {
 public:
  Timer(c10::Device device, int warmup, int runs);

  // Median seconds of one call of `fn`.
  double Median(const std::function<void()>& fn) const;

 private:
  double Once(const std::function<void()>& fn) const;

  c10::Device device_;
  int warmup_;
  int runs_;
};

}  // namespace hyscale::calibrate
