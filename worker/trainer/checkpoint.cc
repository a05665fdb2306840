#include "worker/trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <absl/strings/str_cat.h>
#include <torch/torch.h>

#include <map>

#include "worker/trainer/optimizer.h"
#include "worker/trainer/safetensors.h"

namespace hyscale::trainer {
namespace {

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kRngTensor[] = "rng/cpu";

const std::map<torch::ScalarType, std::string>& dtype_names() {
  static const std::map<torch::ScalarType, std::string> kNames = {
      {torch::kFloat32, "F32"}, {torch::kFloat64, "F64"}, {torch::kBFloat16, "BF16"},
      {torch::kFloat16, "F16"}, {torch::kInt64, "I64"},   {torch::kInt32, "I32"},
      {torch::kUInt8, "U8"}};
  return kNames;
}

SafeTensor to_safetensor(const std::string& name, const torch::Tensor& tensor) {
  const auto t = tensor.detach().to(torch::kCPU).contiguous();
  SafeTensor s;
  s.name = name;
  s.dtype = dtype_names().at(t.scalar_type());
  s.shape = t.sizes().vec();
  s.data.assign(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  return s;
}

torch::Tensor from_safetensor(const SafeTensor& s) {
  for (const auto& [type, name] : dtype_names()) {
    if (name != s.dtype) continue;
    auto t = torch::empty(s.shape, torch::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), s.data.data(), s.data.size());
    return t;
  }
  return torch::Tensor();
}

absl::StatusOr<std::string> encode(const std::map<std::string, torch::Tensor>& tensors,
                                   int64_t step) {
  SafetensorsFile file;
  file.metadata = {{"format", "pt"}, {"hyscale_step", std::to_string(step)}};
  for (const auto& [name, t] : tensors) file.tensors.push_back(to_safetensor(name, t));
  return EncodeSafetensors(file);
}

absl::StatusOr<std::map<std::string, torch::Tensor>> decode(const std::string& bytes,
                                                            const std::string& path) {
  auto file = DecodeSafetensors(bytes, path);
  if (!file.ok()) return file.status();
  std::map<std::string, torch::Tensor> out;
  for (const auto& s : file->tensors) {
    auto t = from_safetensor(s);
    if (!t.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": tensor ", s.name, " has unsupported dtype ", s.dtype));
    }
    out[s.name] = t;
  }
  return out;
}

absl::Status load_weights(torch::nn::Module& model,
                          const std::map<std::string, torch::Tensor>& weights,
                          const std::string& path) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto it = weights.find(item.key());
    if (it == weights.end()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": missing tensor ", item.key()));
    }
    if (it->second.sizes() != item.value().sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": tensor ", item.key(), " has shape ", c10::str(it->second.sizes()),
                       ", the model needs ", c10::str(item.value().sizes())));
    }
    item.value().copy_(it->second);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TrainingCheckpoints::Save(int64_t step, const torch::nn::Module& model,
                                       const torch::optim::AdamW& optimizer) {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model.named_parameters()) weights[item.key()] = item.value();
  auto state = optimizer_state(optimizer, model);
  state[kRngTensor] = at::detail::getDefaultCPUGenerator().get_state();
  auto model_bytes = encode(weights, step);
  if (!model_bytes.ok()) return model_bytes.status();
  auto optimizer_bytes = encode(state, step);
  if (!optimizer_bytes.ok()) return optimizer_bytes.status();
  return store_.Commit(
      step, {{kModelFile, std::move(*model_bytes)}, {kOptimizerFile, std::move(*optimizer_bytes)}});
}

absl::StatusOr<int64_t> TrainingCheckpoints::LoadLatest(torch::nn::Module& model,
                                                        torch::optim::AdamW& optimizer,
                                                        std::vector<std::string>* warnings) {
  auto loaded = store_.LoadLatest(warnings);
  if (!loaded.ok()) return loaded.status();
  const std::string dir = store_.PathOf(loaded->step);
  auto weights = decode(loaded->files[kModelFile], dir + "/" + kModelFile);
  if (!weights.ok()) return weights.status();
  auto state = decode(loaded->files[kOptimizerFile], dir + "/" + kOptimizerFile);
  if (!state.ok()) return state.status();
  if (auto s = load_weights(model, *weights, dir + "/" + kModelFile); !s.ok()) return s;
  if (auto s = load_optimizer_state(optimizer, model, *state); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(dir, "/", kOptimizerFile, ": ", s.message()));
  }
  if (const auto rng = state->find(kRngTensor); rng != state->end()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle: shares state
    generator.set_state(rng->second);
  }
  return loaded->step;
}

}  // namespace hyscale::trainer
