#include "worker/agent/devices.h"

#include <gtest/gtest.h>

namespace hyscale::agent {
namespace {

TEST(DevicesTest, OverrideCpu) {
  auto devices = ParseDeviceOverride("cpu:2");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ((*devices)[0].count(), 2);
  EXPECT_EQ((*devices)[0].name(), "cpu");
  EXPECT_GT((*devices)[0].memory_bytes(), 0);
}

TEST(DevicesTest, OverrideGpusWithMemoryAndList) {
  auto devices = ParseDeviceOverride("gpu:8:141GB, cpu:1:512MiB");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].kind(), v1::DEVICE_KIND_GPU);
  EXPECT_EQ((*devices)[0].count(), 8);
  EXPECT_EQ((*devices)[0].memory_bytes(), int64_t{141} << 30);
  EXPECT_EQ((*devices)[1].memory_bytes(), int64_t{512} << 20);
  EXPECT_EQ(SlotCount(*devices, v1::DEVICE_KIND_GPU), 8);
  EXPECT_EQ(SlotCount(*devices, v1::DEVICE_KIND_CPU), 1);
}

TEST(DevicesTest, OverrideErrorsNameTheProblem) {
  for (const char* bad : {"tpu:2", "cpu", "cpu:0", "cpu:x", "gpu:1:lots", ""}) {
    auto devices = ParseDeviceOverride(bad);
    ASSERT_FALSE(devices.ok()) << bad;
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(devices.status().message().find("devices"), std::string::npos) << bad;
  }
}

TEST(DevicesTest, NvidiaSmiGroupsIdenticalGpus) {
  auto devices = ParseNvidiaSmi("NVIDIA H200, 143771\nNVIDIA H200, 143771\nNVIDIA A10, 23028\n");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].name(), "NVIDIA H200");
  EXPECT_EQ((*devices)[0].count(), 2);
  EXPECT_EQ((*devices)[0].memory_bytes(), int64_t{143771} << 20);
  EXPECT_EQ((*devices)[1].kind(), v1::DEVICE_KIND_GPU);
  EXPECT_FALSE(ParseNvidiaSmi("garbage line\n").ok());
  EXPECT_TRUE(ParseNvidiaSmi("")->empty());
}

TEST(DevicesTest, DetectFindsAtLeastOneDevice) {
  const auto devices = DetectDevices();
  ASSERT_FALSE(devices.empty());
  EXPECT_GT(devices[0].count(), 0);
  EXPECT_FALSE(DescribeDevices(devices).empty());
}

}  // namespace
}  // namespace hyscale::agent
