// The fixture of the GPU kernel tests: skips with the reason where the CUDA kernels were not built
// or no device is present, and seeds torch's generator from the test's seed, so
// HYSCALE_TEST_SEED replays inputs drawn on the GPU too.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "tests/kernels/test_support.h"

namespace hyscale::test {

class GpuKernelTest : public KernelTest {
 protected:
  void SetUp() override {
#ifndef HYSCALE_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA kernels (needs nvcc and a CUDA libtorch)";
#else
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
#endif
    torch::manual_seed(static_cast<uint64_t>(seed_ & 0x7fffffffffffffff));
  }
};

}  // namespace hyscale::test
