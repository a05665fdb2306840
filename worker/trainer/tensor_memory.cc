#include "worker/trainer/tensor_memory.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>

namespace hyscale::trainer::tensor_memory {
namespace {

// Each block starts with a header of the allocator's alignment (64 bytes keeps the data aligned
// as libtorch's own blocks are): its size and tag, read back when it is freed.
constexpr size_t kHeader = 64;
struct Header {
  size_t bytes;
  int tag;
};
static_assert(sizeof(Header) <= kHeader);

// Never destroyed: tensors may be freed during the process's exit.
struct State {
  std::mutex mutex;
  Counts counts;
  std::array<int64_t, kTags + 1> live_by_tag{};
  std::atomic<int (*)()> tag{nullptr};
  c10::Allocator* base = nullptr;
};
State& state() {
  static State* s = new State;
  return *s;
}

void Delete(void* data) {
  if (data == nullptr) return;
  State& s = state();
  auto* block = static_cast<char*>(data) - kHeader;
  const Header header = *reinterpret_cast<const Header*>(block);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.counts.live_bytes -= static_cast<int64_t>(header.bytes);
    s.live_by_tag[header.tag] -= static_cast<int64_t>(header.bytes);
  }
  s.base->raw_deleter()(block);
}

class CountingAllocator final : public c10::Allocator {
 public:
  // libtorch 2.x's allocate is not const and copy_data is to be defined; 1.13 has neither.
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t bytes) override {
    return counted(bytes);
  }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t bytes) const override {
    return counted(bytes);
  }
#endif
  c10::DeleterFnPtr raw_deleter() const override {
    return &Delete;
  }

 private:
  static c10::DataPtr counted(size_t bytes) {
    State& s = state();
    if (bytes == 0) return s.base->allocate(0);
    auto* block = static_cast<char*>(s.base->raw_allocate(bytes + kHeader));
    const auto tag_of = s.tag.load();
    int tag = tag_of ? tag_of() : kUntagged;
    if (tag < 0 || tag >= kTags) tag = kUntagged;
    *reinterpret_cast<Header*>(block) = {bytes, tag};
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      Counts& c = s.counts;
      c.live_bytes += static_cast<int64_t>(bytes);
      s.live_by_tag[tag] += static_cast<int64_t>(bytes);
      if (c.live_bytes > c.peak_bytes) {
        c.peak_bytes = c.live_bytes;
        c.peak_by_tag = s.live_by_tag;
        c.peak_tag = tag;
      }
    }
    void* data = block + kHeader;
    return {data, data, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
};

}  // namespace

void Install(int (*tag)()) {
  State& s = state();
  s.tag.store(tag);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.base != nullptr) return;
  s.base = c10::GetCPUAllocator();
  TORCH_CHECK(s.base->raw_deleter() != nullptr,
              "tensor_memory::Install: the CPU allocator has no raw deleter to wrap");
  static CountingAllocator* counting = new CountingAllocator;
  // Above the default allocator's priority (0), so that it stays installed.
  c10::SetCPUAllocator(counting, /*priority=*/1);
}

bool Installed() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.base != nullptr;
}

Counts Read() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counts;
}

void ResetPeak() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.counts.peak_bytes = s.counts.live_bytes;
  s.counts.peak_by_tag = s.live_by_tag;
  s.counts.peak_tag = kUntagged;
}

}  // namespace hyscale::trainer::tensor_memory
