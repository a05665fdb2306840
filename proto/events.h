// hyscale-train's event lines (hyscale.v1.TrainerEventLine, proto/hyscale/v1/events.proto): the
// one writer and the one reader, and the step phases' names.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <vector>

#include "hyscale/v1/events.pb.h"

namespace hyscale {

// A layer's phases are timed apart in each pass; data, optimizer and other once a step.
bool TimedPerPass(v1::StepPhase phase);
// The phase's name on the wire: "attention_fwd", "mlp_recompute", "data", ... (`pass` is ignored
// for a phase timed once a step).
std::string PhaseName(v1::StepPhase phase, v1::StepPass pass);
// Every name PhaseName returns, in step order (a layer's phases forward, then backward).
const std::vector<std::string>& PhaseNames();
bool IsPhaseName(std::string_view name);

// The event as one JSON line, without the newline.
absl::StatusOr<std::string> FormatEventLine(const v1::TrainerEventLine& event);

// A line as a trainer wrote it. It is untrusted (the coordinator reads what an agent forwards):
// INVALID_ARGUMENT, naming the field, for anything protobuf's JSON parser refuses (an unknown
// field or kind, a wrong type, an integer that does not fit), for a line of no kind, and for a
// negative number where every integer is a count or an index.
absl::StatusOr<v1::TrainerEventLine> ParseEventLine(std::string_view line);

// A step's losses as the trainer's log and `hyscale watch` print them: "loss 2.5000 (lm 2.0000,
// indexer 0.5000)", without lm where the step reports none (a stage training the indexer alone).
std::string DescribeLosses(const v1::TrainerEventLine::Step& step);

// The kind's field name: "step", "warning", "job_finished", ...; "" when none is set.
std::string_view EventKind(const v1::TrainerEventLine& event);

}  // namespace hyscale
