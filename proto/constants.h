// What HyScale's programs agree on besides their protos: exit codes, limits, and the query group
// sizes G of the sparse attention kernels. Plain C++ without protobuf: the trainer, the tools and
// the service include it alike.
#pragma once

#include <cstddef>

namespace hyscale {

// Exit codes of hyscale-train, which the coordinator reads from RankExit.exit_code (no restart
// after kExitBadInput or kExitOutOfMemory; any code not listed is a failure worth one), and the
// first three of every other HyScale program.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;     // bad flags, the spec or its files: fails alike again
inline constexpr int kExitOutOfMemory = 3;  // hyscale-train: a CUDA or CPU allocation failed

// The longest trainer event line: the agent takes a longer stdout line for log output only.
inline constexpr size_t kMaxEventLineBytes = 1 << 20;
// Ranks of one job at most (the coordinator's limit), and so context parallelism's degree.
inline constexpr int kMaxRanks = 1024;

// The largest group of adjacent queries whose key sharing an evaluation reports (G = 2, 4, ..,
// 64: TrainerEventLine.Step.Evaluation.key_sharing); the coordinator exports no other G.
inline constexpr int kMaxKeySharingGroup = 64;
constexpr bool IsKeySharingGroup(int g) {
  return g >= 2 && g <= kMaxKeySharingGroup && (g & (g - 1)) == 0;
}

// The query group sizes G the sparse attention kernels take (DESIGN.md section 1, item 4).
inline constexpr int kQueryGroups[] = {1, 2, 4, 8, 16};
inline constexpr char kQueryGroupsText[] = "1, 2, 4, 8 or 16";

constexpr bool IsQueryGroup(int g) {
  for (const int known : kQueryGroups) {
    if (g == known) return true;
  }
  return false;
}

}  // namespace hyscale
