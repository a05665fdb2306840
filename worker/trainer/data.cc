#include "worker/trainer/data.h"

#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <numeric>
#include <string>
#include <utility>

#include "proto/job_spec.h"

namespace hyscale::trainer {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A SplitMix64 stream with unbiased bounded draws: fully specified here, so batches do not depend
// on the standard library's distributions.
class Rng {
 public:
  // One independent stream per (seed, split, batch index).
  Rng(uint64_t seed, Split split, int64_t index)
      : state_(splitmix64(splitmix64(splitmix64(seed) + static_cast<uint64_t>(split)) +
                          static_cast<uint64_t>(index))) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return splitmix64(state_);
  }

  // Uniform in [0, n), n > 0: rejects the low values that would make `% n` biased.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % n;
    }
  }

  // Moves a uniform random sample of `k` elements, in random order, to the front of `v`.
  template <typename T>
  void SampleToFront(std::vector<T>& v, size_t k) {
    for (size_t i = 0; i < k; ++i) std::swap(v[i], v[i + Below(v.size() - i)]);
  }

 private:
  uint64_t state_;
};

BatchShape shape_of(const v1::DataSpec& data) {
  return {data.batch_size(), data.seq_len()};
}

Batch empty_batch(BatchShape shape, int32_t fill_target) {
  Batch b;
  b.batch_size = shape.batch_size;
  b.seq_len = shape.seq_len;
  b.inputs.assign(b.batch_size * b.seq_len, 0);
  b.targets.assign(b.batch_size * b.seq_len, fill_target);
  return b;
}

std::vector<int32_t> iota_vector(int64_t count, int64_t first) {
  std::vector<int32_t> v(count);
  std::iota(v.begin(), v.end(), static_cast<int32_t>(first));
  return v;
}

// ---- Synthetic multi-query associative recall (layout in data.h) ----

class RecallTask : public DataSource {
 public:
  explicit RecallTask(const v1::JobSpec& spec)
      : DataSource(shape_of(spec.data())),
        recall_(spec.data().recall()),
        vocab_(RecallVocab::Of(spec.data().recall())),
        seed_(spec.seed()) {}

  using DataSource::Get;
  Batch Get(Split split, int64_t index, BatchShape shape) const override {
    Batch b = empty_batch(shape, -1);
    Rng rng(seed_, split, index);
    for (int64_t row = 0; row < b.batch_size; ++row) {
      FillRow(rng, b.seq_len, b.inputs.data() + row * b.seq_len,
              b.targets.data() + row * b.seq_len);
    }
    return b;
  }

 private:
  void FillRow(Rng& rng, int64_t seq_len, int32_t* tokens, int32_t* targets) const {
    const int64_t pairs = recall_.pairs(), queries = recall_.queries();
    const int64_t context = seq_len - 2 * queries - 1;
    for (int64_t i = 0; i < context; ++i) {
      tokens[i] = static_cast<int32_t>(rng.Below(RecallVocab::kFillerCount));
    }
    tokens[context] = static_cast<int32_t>(RecallVocab::kQueryMarker);

    std::vector<int32_t> keys = iota_vector(vocab_.key_count, vocab_.first_key);
    rng.SampleToFront(keys, pairs);
    std::vector<int32_t> values(pairs);
    for (auto& v : values) {
      v = static_cast<int32_t>(vocab_.first_value + rng.Below(vocab_.value_count));
    }

    // Non-overlapping pairs, uniformly: the context is `pairs` pair items (a bigram, or one pair
    // token) and fillers; choose which items are pairs, then shift the i-th by the i bigram values
    // before it.
    const int64_t width = recall_.pair_tokens() ? 1 : 2;
    std::vector<int32_t> slots = iota_vector(context - (width - 1) * pairs, 0);
    rng.SampleToFront(slots, pairs);
    std::sort(slots.begin(), slots.begin() + pairs);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t at = slots[p] + (width - 1) * p;
      if (recall_.pair_tokens()) {
        tokens[at] = static_cast<int32_t>(vocab_.Pair(keys[p], values[p]));
      } else {
        tokens[at] = keys[p];
        tokens[at + 1] = values[p];
      }
    }

    std::vector<int32_t> asked = iota_vector(pairs, 0);
    rng.SampleToFront(asked, queries);
    for (int64_t q = 0; q < queries; ++q) {
      const int64_t at = context + 1 + 2 * q;
      tokens[at] = keys[asked[q]];
      tokens[at + 1] = values[asked[q]];
      targets[at] = values[asked[q]];
    }
  }

  const v1::RecallData recall_;
  const RecallVocab vocab_;
  const uint64_t seed_;
};

// ---- Token and text files ----

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  // `what` ("field: path") starts every error.
  static absl::StatusOr<MappedFile> Open(const std::string& path, const std::string& what) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(what, ": cannot open"));
    absl::StatusOr<MappedFile> file = Map(fd, what);
    ::close(fd);  // a mapping outlives its descriptor
    return file;
  }

  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;

  static absl::StatusOr<MappedFile> Map(int fd, const std::string& what) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(what, ": cannot stat"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a regular file"));
    }
    MappedFile file;
    if (st.st_size > 0) {  // mmap refuses empty files; they are caught as short
      void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat(what, ": cannot map"));
      file.data_ = static_cast<const unsigned char*>(data);
      file.size_ = static_cast<size_t>(st.st_size);
    }
    return file;
  }

  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// Little-endian unsigned tokens of `width` bytes over a mapped file.
class TokenArray {
 public:
  TokenArray(MappedFile file, int width) : file_(std::move(file)), width_(width) {}

  int width() const { return width_; }
  size_t bytes() const { return file_.size(); }
  int64_t size() const { return static_cast<int64_t>(file_.size()) / width_; }
  uint32_t operator[](int64_t i) const {
    const unsigned char* p = file_.data() + i * width_;
    uint32_t token = 0;
    for (int b = 0; b < width_; ++b) token |= static_cast<uint32_t>(p[b]) << (8 * b);
    return token;
  }

 private:
  MappedFile file_;
  int width_;
};

// Checks what every window relies on: whole tokens, at least one window, ids within the model.
absl::Status check_tokens(const TokenArray& tokens, const v1::JobSpec& spec,
                          const std::string& what) {
  if (tokens.bytes() % tokens.width() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": corrupt: size ", tokens.bytes(),
                                                   " bytes is not a multiple of the ",
                                                   tokens.width(), "-byte token size"));
  }
  const int64_t need = int64_t{spec.data().seq_len()} + 1;
  if (tokens.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": short: ", tokens.size(),
                                                   " tokens, need ", need, " (data.seq_len + 1)"));
  }
  const uint32_t vocab = static_cast<uint32_t>(spec.model().vocab_size());
  for (int64_t i = 0; i < tokens.size(); ++i) {
    // Neither the id nor where it is: errors reach other users, and the bytes are the file's.
    if (tokens[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": corrupt: holds a token id >= model.vocab_size ", vocab));
    }
  }
  return absl::OkStatus();
}

// Windows of seq_len + 1 tokens at random offsets; the split ranges are described in data.h.
class TokenWindows : public DataSource {
 public:
  TokenWindows(TokenArray tokens, const v1::JobSpec& spec)
      : DataSource(shape_of(spec.data())), tokens_(std::move(tokens)), seed_(spec.seed()) {
    const int64_t n = tokens_.size(), window = spec.data().seq_len() + 1;
    const int64_t tail = std::max(n / 10, window);
    if (n - tail >= window) {
      train_ = {0, n - tail};
      eval_ = {n - tail, n};
    } else {
      train_ = eval_ = {0, n};
    }
  }

  using DataSource::Get;
  Batch Get(Split split, int64_t index, BatchShape shape) const override {
    Batch b = empty_batch(shape, 0);
    const auto [begin, end] = split == Split::kTrain ? train_ : eval_;
    const int64_t starts = end - begin - b.seq_len;  // windows of seq_len + 1 fitting the range
    Rng rng(seed_, split, index);
    for (int64_t row = 0; row < b.batch_size; ++row) {
      const int64_t start = begin + static_cast<int64_t>(rng.Below(starts));
      int32_t* inputs = b.inputs.data() + row * b.seq_len;
      int32_t* targets = b.targets.data() + row * b.seq_len;
      for (int64_t t = 0; t < b.seq_len; ++t) {
        inputs[t] = static_cast<int32_t>(tokens_[start + t]);
        targets[t] = static_cast<int32_t>(tokens_[start + t + 1]);
      }
    }
    return b;
  }

 private:
  const TokenArray tokens_;
  const uint64_t seed_;
  std::pair<int64_t, int64_t> train_, eval_;  // [begin, end) token ranges
};

absl::StatusOr<std::unique_ptr<DataSource>> open_token_file(const v1::JobSpec& spec,
                                                            const std::string& field,
                                                            const std::string& path, int width) {
  const std::string what = absl::StrCat(field, ": ", path);
  auto file = MappedFile::Open(path, what);
  if (!file.ok()) return file.status();
  TokenArray tokens(std::move(*file), width);
  if (auto status = check_tokens(tokens, spec, what); !status.ok()) return status;
  return std::make_unique<TokenWindows>(std::move(tokens), spec);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> MakeDataSource(const v1::JobSpec& spec) {
  if (auto status = ValidateJobSpec(spec); !status.ok()) return status;
  const v1::DataSpec& data = spec.data();
  switch (data.source_case()) {
    case v1::DataSpec::kRecall:
      return std::make_unique<RecallTask>(spec);
    case v1::DataSpec::kTokenFile:
      return open_token_file(spec, "data.token_file.path", data.token_file().path(),
                             data.token_file().dtype() == v1::UINT32 ? 4 : 2);
    case v1::DataSpec::kTextFile:
      return open_token_file(spec, "data.text_file.path", data.text_file().path(), 1);
    case v1::DataSpec::SOURCE_NOT_SET:
      break;  // rejected by ValidateJobSpec
  }
  return absl::InvalidArgumentError("data: must set one of recall, token_file or text_file");
}

absl::StatusOr<QueryAccuracy> ScoreQueries(const std::vector<int32_t>& predicted,
                                           const std::vector<int32_t>& targets) {
  if (predicted.size() != targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ScoreQueries: ", predicted.size(), " predictions for ", targets.size(), " targets"));
  }
  QueryAccuracy accuracy;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] < 0) continue;
    ++accuracy.counted;
    accuracy.correct += predicted[i] == targets[i];
  }
  return accuracy;
}

}  // namespace hyscale::trainer
