// libFuzzer target: any bytes through ParseJobSpec (JSON when the input starts with '{', else
// YAML), then ApplyDefaults and ValidateJobSpec. Besides "no crash, hang or leak" it checks the
// contracts job_spec.h promises, aborting (a finding) when one breaks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/job_spec.h"

namespace {

void Require(bool ok, const char* contract) {
  if (ok) return;
  std::fprintf(stderr, "job_spec contract broken: %s\n", contract);
  std::abort();
}

// Errors are INVALID_ARGUMENT with a message that says what is wrong.
void RequireInvalidArgument(const absl::Status& status) {
  Require(absl::IsInvalidArgument(status), "errors are INVALID_ARGUMENT");
  Require(!status.message().empty(), "errors carry a message");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto format = !text.empty() && text.front() == '{' ? hyscale::SpecFormat::kJson
                                                           : hyscale::SpecFormat::kYaml;
  const absl::StatusOr<hyscale::v1::JobSpec> raw = hyscale::ParseJobSpec(text, format);
  if (!raw.ok()) {
    RequireInvalidArgument(raw.status());
    return 0;
  }

  hyscale::v1::JobSpec defaulted = *raw;
  hyscale::ApplyDefaults(&defaulted);
  hyscale::v1::JobSpec twice = defaulted;
  hyscale::ApplyDefaults(&twice);
  Require(twice.SerializeAsString() == defaulted.SerializeAsString(),
          "ApplyDefaults is idempotent");

  // ValidateJobSpec defaults a copy itself, so a raw and a defaulted spec get the same verdict.
  const absl::Status verdict = hyscale::ValidateJobSpec(*raw);
  Require(verdict == hyscale::ValidateJobSpec(defaulted), "raw and defaulted specs validate alike");
  if (!verdict.ok()) {
    RequireInvalidArgument(verdict);
    return 0;
  }

  // A valid recall spec's vocabulary fits the model (validation promises it to the trainer).
  if (defaulted.data().has_recall()) {
    const auto vocab = hyscale::RecallVocab::Of(defaulted.data().recall());
    Require(vocab.size() <= defaulted.model().vocab_size(), "recall vocabulary fits vocab_size");
  }
  return 0;
}
