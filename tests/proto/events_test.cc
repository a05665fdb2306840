// The trainer's event lines: what FormatEventLine writes ParseEventLine reads back; a line from an
// untrusted process is refused when a field is unknown, mistyped, does not fit its integer, or is
// a negative count; the step phases' names come from the proto enums.
#include "proto/events.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>

namespace hyscale {
namespace {

using ::testing::HasSubstr;

TEST(EventLine, RoundTripsThroughOneJsonLine) {
  v1::TrainerEventLine event;
  event.set_time(1700000000.5);
  auto* step = event.mutable_step();
  step->set_step(2);
  step->set_total_steps(5);
  step->set_peak_memory_bytes(int64_t{3} << 40);
  (*step->mutable_phase_seconds())["attention_fwd"] = 0.25;
  step->mutable_evaluation()->set_accuracy(0.75);
  const auto line = FormatEventLine(event);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->find('\n'), std::string::npos);
  // The proto's field names, zeros included, so a person or jq sees the whole record.
  EXPECT_THAT(*line, HasSubstr(R"("step":{"step":"2","total_steps":"5","stage":0,)"));
  EXPECT_THAT(*line, HasSubstr(R"("phase_seconds":{"attention_fwd":0.25})"));
  const auto parsed = ParseEventLine(*line);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*parsed, event));
  EXPECT_EQ(EventKind(*parsed), "step");
}

// `event`, written and read again, is the same event.
void ExpectReadsBackTheSame(const v1::TrainerEventLine& event) {
  const auto line = FormatEventLine(event);
  ASSERT_TRUE(line.ok()) << line.status();
  const auto again = ParseEventLine(*line);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*again, event)) << *line;
}

// JSON writes -0.0 as -0, which reads back as an unset 0: a negative zero reads as that 0 the
// first time too (found by tests/fuzz/request_fuzz).
TEST(EventLine, NegativeZeroReadsAsZero) {
  const auto parsed = ParseEventLine(R"({"time":-0.0,"step":{"step":3,"eta_seconds":-.0}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(std::signbit(parsed->time()));
  EXPECT_FALSE(std::signbit(parsed->step().eta_seconds()));
  ExpectReadsBackTheSame(*parsed);
}

// The same inside a listed message, whose fields are singular.
TEST(EventLine, NegativeZeroInAListedMessageReadsAsZero) {
  const auto parsed = ParseEventLine(
      R"({"step":{"step":3,"evaluation":{"key_sharing":[{"group":2,"selected_per_distinct":-.0}]}}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->step().evaluation().key_sharing_size(), 1);
  EXPECT_FALSE(std::signbit(parsed->step().evaluation().key_sharing(0).selected_per_distinct()));
  ExpectReadsBackTheSame(*parsed);
}

TEST(EventLine, IntegersMayBeWrittenAsJsonNumbers) {
  const auto parsed = ParseEventLine(R"({"time":1,"step":{"step":3,"peak_memory_bytes":1024}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->step().step(), 3);
  EXPECT_EQ(parsed->step().peak_memory_bytes(), 1024);
}

TEST(EventLine, RefusesWhatDoesNotFitTheSchema) {
  const auto error = [](const char* line) { return ParseEventLine(line).status(); };
  EXPECT_THAT(error(R"({"step":{"step":488888888888888888888888888}})").message(),
              HasSubstr("step.step"));
  EXPECT_THAT(error(R"({"step":{"step":2.5}})").message(), HasSubstr("step.step"));
  EXPECT_THAT(error(R"({"step":{"stage":4294967296}})").message(), HasSubstr("step.stage"));
  EXPECT_THAT(error(R"({"step":{"peak_memory_bytes":-1}})").message(),
              HasSubstr("step.peak_memory_bytes: must be >= 0"));
  EXPECT_THAT(error(R"({"step":{"comm":{"exposed":"x"}}})").message(),
              HasSubstr("step.comm.exposed"));
  EXPECT_THAT(error(R"({"joined":{}})").message(), HasSubstr("joined"));
  EXPECT_THAT(error(R"({"time":1})").message(), HasSubstr("no kind"));
  EXPECT_FALSE(ParseEventLine(R"({"step":{},"warning":"two kinds"})").ok());
  EXPECT_FALSE(ParseEventLine("not json").ok());
  EXPECT_FALSE(ParseEventLine("[1]").ok());
}

TEST(EventLine, KindIsTheOneofFieldsName) {
  v1::TrainerEventLine event;
  EXPECT_EQ(EventKind(event), "");
  event.set_warning("disk almost full");
  EXPECT_EQ(EventKind(event), "warning");
  event.mutable_checkpoint_written();
  EXPECT_EQ(EventKind(event), "checkpoint_written");
}

TEST(PhaseNames, LayerPhasesCarryTheirPassOthersDoNot) {
  EXPECT_EQ(PhaseName(v1::STEP_PHASE_ATTENTION, v1::STEP_PASS_FWD), "attention_fwd");
  EXPECT_EQ(PhaseName(v1::STEP_PHASE_INDEXER_LOSS, v1::STEP_PASS_RECOMPUTE),
            "indexer_loss_recompute");
  EXPECT_EQ(PhaseName(v1::STEP_PHASE_MLP, v1::STEP_PASS_BWD), "mlp_bwd");
  EXPECT_EQ(PhaseName(v1::STEP_PHASE_DATA, v1::STEP_PASS_BWD), "data");
  // 7 layer phases in 3 passes, and data, optimizer, other.
  EXPECT_EQ(PhaseNames().size(), 7u * 3 + 3);
  EXPECT_EQ(PhaseNames().front(), "data");
  EXPECT_TRUE(IsPhaseName("selection_recompute"));
  EXPECT_FALSE(IsPhaseName("selection"));
  EXPECT_FALSE(IsPhaseName("data_fwd"));
}

}  // namespace
}  // namespace hyscale
