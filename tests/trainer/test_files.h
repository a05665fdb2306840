// Scratch files for the trainer support tests: a fresh directory per test, removed afterwards.
#pragma once

#include <fstream>
#include <string>

#include "util/file.h"
#include "util/temp_dir.h"

namespace hyscale::trainer {

class ScratchDir {
 public:
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  // Writes `bytes` to Path(name) and returns that path.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string path = Path(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // The file's bytes; empty when it cannot be read.
  static std::string Read(const std::string& path) { return util::ReadFile(path).value_or(""); }

 private:
  const util::TempDir dir_ = util::TempDir::Create("hyscale").value();
};

}  // namespace hyscale::trainer
