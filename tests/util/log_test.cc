#include "util/log.h"

#include <gtest/gtest.h>

namespace hyscale::util {
namespace {

TEST(LogTest, ALineHasTheUtcTimeToTheMillisecondTheLevelAndTheProgram) {
  const absl::Time time = absl::FromUnixMillis(1767225600123);  // 2026-01-01 00:00:00.123 UTC
  EXPECT_EQ(FormatLogLine(time, LogLevel::kWarning, "hyscaled", "job j: stored"),
            "2026-01-01T00:00:00.123Z WARNING hyscaled: job j: stored\n");
  EXPECT_EQ(FormatLogLine(time, LogLevel::kInfo, "w", "m"), "2026-01-01T00:00:00.123Z INFO w: m\n");
  EXPECT_EQ(FormatLogLine(time, LogLevel::kError, "w", "m"),
            "2026-01-01T00:00:00.123Z ERROR w: m\n");
}

TEST(LogTest, AnUnknownLevelIsRefused) {
  const absl::Status status = SetMinLogLevel("debug");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("'debug'"), std::string::npos) << status;
}

TEST(LogTest, LinesGoToStderrFromTheMinimumLevelUp) {
  ::testing::internal::CaptureStderr();
  LogInfo("shown ", 1);
  ASSERT_TRUE(SetMinLogLevel("WARNING").ok());
  LogInfo("hidden");
  LogWarning("warned ", 2.5);
  LogError("failed");
  ASSERT_TRUE(SetMinLogLevel("info").ok());
  const std::string text = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(text.find(" INFO util_test: shown 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("hidden"), std::string::npos) << text;
  EXPECT_NE(text.find(" WARNING util_test: warned 2.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" ERROR util_test: failed\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace hyscale::util
