#include "proto/events.h"

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <vector>

#include "proto/proto_json.h"

namespace hyscale {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// "STEP_PHASE_INDEXER_LOSS" -> "indexer_loss".
std::string Unprefixed(const std::string& value_name, std::string_view prefix) {
  return absl::AsciiStrToLower(value_name.substr(prefix.size()));
}

// The first negative integer in `message` or its messages, as "path: must be >= 0 (got -1)";
// "" when there is none.
std::string NegativeInteger(const Message& message, const std::string& path) {
  const auto* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string at = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()) {
      if (auto found = NegativeInteger(reflection->GetMessage(message, field), at);
          !found.empty()) {
        return found;
      }
      continue;
    }
    if (field->is_repeated()) continue;  // the events have no repeated integers
    int64_t value = 0;
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      value = reflection->GetInt32(message, field);
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
      value = reflection->GetInt64(message, field);
    }
    if (value < 0) return absl::StrCat(at, ": must be >= 0 (got ", value, ")");
  }
  return "";
}

// Clears the singular floating-point fields of `message` and its messages that hold -0.0. JSON
// writes -0.0 as -0, which reads back as 0, an unset field: without this a line read, written and
// read again would differ from the first reading.
void ClearNegativeZeros(Message* message) {
  const auto* reflection = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->is_repeated()) {
      // Map values and list items stay set whatever their value; a listed message's fields are
      // singular again.
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_map()) {
        for (int i = 0; i < reflection->FieldSize(*message, field); ++i) {
          ClearNegativeZeros(reflection->MutableRepeatedMessage(message, field, i));
        }
      }
      continue;
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      ClearNegativeZeros(reflection->MutableMessage(message, field));
    } else if ((field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE &&
                reflection->GetDouble(*message, field) == 0) ||
               (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT &&
                reflection->GetFloat(*message, field) == 0)) {
      reflection->ClearField(message, field);
    }
  }
}

}  // namespace

bool TimedPerPass(v1::StepPhase phase) {
  return phase != v1::STEP_PHASE_DATA && phase != v1::STEP_PHASE_OPTIMIZER &&
         phase != v1::STEP_PHASE_OTHER;
}

std::string PhaseName(v1::StepPhase phase, v1::StepPass pass) {
  const std::string name = Unprefixed(v1::StepPhase_Name(phase), "STEP_PHASE_");
  if (!TimedPerPass(phase)) return name;
  return absl::StrCat(name, "_", Unprefixed(v1::StepPass_Name(pass), "STEP_PASS_"));
}

const std::vector<std::string>& PhaseNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto pass : {v1::STEP_PASS_FWD, v1::STEP_PASS_RECOMPUTE, v1::STEP_PASS_BWD}) {
      for (int p = v1::STEP_PHASE_UNSPECIFIED + 1; p <= v1::StepPhase_MAX; ++p) {
        const auto phase = static_cast<v1::StepPhase>(p);
        if (TimedPerPass(phase) || pass == v1::STEP_PASS_FWD) out.push_back(PhaseName(phase, pass));
      }
    }
    return out;
  }();
  return names;
}

bool IsPhaseName(std::string_view name) {
  const auto& names = PhaseNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

absl::StatusOr<std::string> FormatEventLine(const v1::TrainerEventLine& event) {
  return PrintProtoJson(event, JsonLayout::kLine);
}

absl::StatusOr<v1::TrainerEventLine> ParseEventLine(std::string_view line) {
  v1::TrainerEventLine event;
  if (auto status = ParseProtoJson(line, &event); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer event: ", status.message()));
  }
  if (event.kind_case() == v1::TrainerEventLine::KIND_NOT_SET) {
    return absl::InvalidArgumentError("trainer event: no kind (step, warning, ...)");
  }
  if (const std::string negative = NegativeInteger(event, ""); !negative.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer event: ", negative));
  }
  ClearNegativeZeros(&event);
  return event;
}

std::string_view EventKind(const v1::TrainerEventLine& event) {
  const auto* kind = event.GetReflection()->GetOneofFieldDescriptor(
      event, v1::TrainerEventLine::descriptor()->FindOneofByName("kind"));
  return kind == nullptr ? std::string_view() : std::string_view(kind->name());
}

std::string DescribeLosses(const v1::TrainerEventLine::Step& step) {
  return absl::StrCat(
      "loss ", absl::StrFormat("%.4f", step.loss()), " (",
      step.has_lm_loss() ? absl::StrCat("lm ", absl::StrFormat("%.4f", step.lm_loss()), ", ") : "",
      "indexer ", absl::StrFormat("%.4f", step.indexer_loss()), ")");
}

}  // namespace hyscale
