#include "worker/agent/trainer_process.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/agent/fake_trainer.h"
#include "util/temp_dir.h"

namespace hyscale::agent {
namespace {

using std::chrono::milliseconds;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A process that exists and is not a zombie.
bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

v1::RunRank MakeRun(const std::string& mode, int rank = 0, int attempt = 0) {
  v1::RunRank run;
  run.mutable_ref()->set_job_id("job-1");
  run.mutable_ref()->set_rank(rank);
  run.mutable_ref()->set_attempt(attempt);
  run.set_world_size(2);
  run.set_rendezvous("127.0.0.1:29500");
  run.set_device_index(1);
  run.mutable_spec()->set_name(mode);
  run.mutable_spec()->mutable_data()->set_seq_len(64);
  return run;
}

// Collects a process's callbacks.
struct Recorder {
  std::mutex mu;
  pid_t started = 0;
  std::vector<std::string> events;
  std::string log;
  std::vector<TrainerExit> exits;

  TrainerProcess::Callbacks Callbacks() {
    TrainerProcess::Callbacks callbacks;
    callbacks.on_start = [this](pid_t pid) {
      std::lock_guard<std::mutex> lock(mu);
      started = pid;
    };
    callbacks.on_event = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(line);
    };
    callbacks.on_log = [this](const std::string& chunk) {
      std::lock_guard<std::mutex> lock(mu);
      log += chunk;
    };
    callbacks.on_exit = [this](const TrainerExit& exit) {
      std::lock_guard<std::mutex> lock(mu);
      exits.push_back(exit);
    };
    return callbacks;
  }
};

// The trainer was reported killed by SIGKILL, and `child` (of its process group) is gone too.
void ExpectKilledWithItsChild(Recorder& recorder, pid_t child) {
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    ASSERT_EQ(recorder.exits.size(), 1u);
    EXPECT_EQ(recorder.exits[0].signal, SIGKILL);
  }
  for (int i = 0; i < 100 && Alive(child); ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(Alive(child));
}

class TrainerProcessTest : public ::testing::Test {
 protected:
  // The pid the fake trainer's background child writes (the "sleep" and "stubborn" scripts).
  pid_t WaitForChildPid() {
    const std::string pid_file = dir_.path() + "/work/job-1/0/rank0/child.pid";
    for (int i = 0; i < 200 && ReadAll(pid_file).empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::stoi(ReadAll(pid_file));
  }

  TrainerProcessTest() : trainer_(testing::WriteFakeTrainer(dir_.path())) {}

  TrainerCommand Prepare(const v1::RunRank& run, bool gpus = false) {
    auto command = PrepareRank(run, Setup(gpus));
    EXPECT_TRUE(command.ok()) << command.status();
    return *command;
  }

  // Jobs may read <dir>/data and write under <dir>/work and <dir>/shared/ckpt.
  RankSetup Setup(bool gpus = false) const {
    return {
        dir_.path() + "/work", trainer_, gpus,
        JobPaths({dir_.path() + "/data"}, {dir_.path() + "/work", dir_.path() + "/shared/ckpt"}),
        std::nullopt};
  }

  const util::TempDir dir_ = util::TempDir::Create("hyscale-agent").value();
  std::string trainer_;
};

TEST_F(TrainerProcessTest, PrepareWritesSpecAndCommand) {
  v1::RunRank run = MakeRun("ok", 1, 2);
  run.set_checkpoint_dir(dir_.path() + "/shared/ckpt/job-1");
  run.set_resume(true);
  const TrainerCommand command = Prepare(run, /*gpus=*/true);
  const std::string rank_dir = dir_.path() + "/work/job-1/2/rank1";
  EXPECT_EQ(command.args, (std::vector<std::string>{
                              "--config", rank_dir + "/job.json", "--checkpoint-dir",
                              dir_.path() + "/shared/ckpt/job-1", "--resume", "--device", "cuda"}));
  EXPECT_EQ(command.log_path, dir_.path() + "/work/job-1/2/rank1.log");
  const std::string json = ReadAll(rank_dir + "/job.json");
  EXPECT_NE(json.find("\"seq_len\": 64"), std::string::npos) << json;  // proto field names
  const auto env = [&](const std::string& name) {
    for (const auto& [key, value] : command.env) {
      if (key == name) return value;
    }
    return std::string("<unset>");
  };
  EXPECT_EQ(env("HYSCALE_JOB_ID"), "job-1");
  EXPECT_EQ(env("HYSCALE_RANK"), "1");
  EXPECT_EQ(env("HYSCALE_ATTEMPT"), "2");
  EXPECT_EQ(env("HYSCALE_WORLD_SIZE"), "2");
  EXPECT_EQ(env("HYSCALE_RENDEZVOUS"), "127.0.0.1:29500");
  EXPECT_EQ(env("HYSCALE_DEVICE_INDEX"), "1");
  EXPECT_EQ(env("CUDA_VISIBLE_DEVICES"), "1");
}

TEST_F(TrainerProcessTest, PrepareDefaultsCheckpointDirAndSkipsCudaOnCpu) {
  const TrainerCommand command = Prepare(MakeRun("ok"));
  EXPECT_EQ(command.args[3], dir_.path() + "/work/job-1/checkpoints");
  for (const auto& [key, value] : command.env) EXPECT_NE(key, "CUDA_VISIBLE_DEVICES");
}

TEST_F(TrainerProcessTest, PrepareKeepsTheSpecsCheckpointDir) {
  v1::RunRank run = MakeRun("ok");
  run.mutable_spec()->mutable_checkpoint()->set_dir(dir_.path() + "/shared/ckpt/mine");
  const TrainerCommand command = Prepare(run);
  EXPECT_EQ(command.args,
            (std::vector<std::string>{"--config", dir_.path() + "/work/job-1/0/rank0/job.json",
                                      "--checkpoint-dir", dir_.path() + "/shared/ckpt/mine",
                                      "--device", "cpu"}));
}

// A job names its own files: only those in the worker's folders pass, symlinks resolved, and
// the error names the field but shows nothing of the file.
TEST_F(TrainerProcessTest, PrepareConfinesDataAndCheckpointPaths) {
  std::filesystem::create_directories(dir_.path() + "/data");
  std::ofstream(dir_.path() + "/data/text.txt") << "hello";
  std::filesystem::create_symlink("/etc/passwd", dir_.path() + "/data/link");
  const auto refused = [&](auto edit) {
    v1::RunRank run = MakeRun("ok");
    edit(run);
    auto command = PrepareRank(run, Setup());
    EXPECT_TRUE(absl::IsInvalidArgument(command.status())) << command.status();
    return std::string(command.status().message());
  };
  EXPECT_NE(refused([](v1::RunRank& run) {
              run.mutable_spec()->mutable_data()->mutable_text_file()->set_path("/etc/passwd");
            }).find("spec.data.text_file.path: '/etc/passwd' is outside"),
            std::string::npos);
  const std::string link = dir_.path() + "/data/link";
  EXPECT_NE(refused([&](v1::RunRank& run) {
              run.mutable_spec()->mutable_data()->mutable_token_file()->set_path(link);
            }).find("spec.data.token_file.path"),
            std::string::npos);
  EXPECT_NE(refused([&](v1::RunRank& run) {
              run.mutable_spec()->mutable_data()->mutable_text_file()->set_path(dir_.path() +
                                                                                "/data/../work/x");
            }).find("--data-root"),
            std::string::npos);
  EXPECT_NE(refused([](v1::RunRank& run) {
              run.mutable_spec()->mutable_data()->mutable_text_file()->set_path("data/text.txt");
            }).find("must be an absolute path"),
            std::string::npos);
  EXPECT_NE(refused([](v1::RunRank& run) { run.set_checkpoint_dir("/etc/cron.d"); })
                .find("run.checkpoint_dir: '/etc/cron.d' is outside the folders this worker "
                      "allows (--checkpoint-root"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/work/job-1/0/rank0/job.json"));

  v1::RunRank run = MakeRun("ok");
  run.mutable_spec()->mutable_data()->mutable_text_file()->set_path(dir_.path() +
                                                                    "/data/./text.txt");
  Prepare(run);
  EXPECT_NE(ReadAll(dir_.path() + "/work/job-1/0/rank0/job.json")
                .find("\"path\": \"" + std::filesystem::canonical(dir_.path()).string() +
                      "/data/text.txt\""),
            std::string::npos);
}

TEST_F(TrainerProcessTest, PrepareRejectsUnsafeJobId) {
  v1::RunRank run = MakeRun("ok");
  run.mutable_ref()->set_job_id("../escape");
  auto command = PrepareRank(run, Setup());
  ASSERT_FALSE(command.ok());
  EXPECT_NE(command.status().message().find("job_id"), std::string::npos);
}

TEST_F(TrainerProcessTest, EventsInOrderAndLogKept) {
  const TrainerCommand command = Prepare(MakeRun("ok"));
  Recorder recorder;
  auto process = TrainerProcess::Start(command, recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(std::chrono::seconds(20)));
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.started, (*process)->pid());
  ASSERT_EQ(recorder.events.size(), 5u);
  EXPECT_NE(recorder.events[0].find("job_started"), std::string::npos);
  for (int i = 1; i <= 3; ++i) {
    EXPECT_NE(recorder.events[i].find("\"step\":" + std::to_string(i)), std::string::npos);
  }
  EXPECT_NE(recorder.events[4].find("job_finished"), std::string::npos);
  ASSERT_EQ(recorder.exits.size(), 1u);
  EXPECT_EQ(recorder.exits[0].exit_code, 0);
  EXPECT_EQ(recorder.exits[0].signal, 0);
  // stdout and stderr both in the log, forwarded and on disk.
  const std::string file = ReadAll(command.log_path);
  for (const std::string* log : {static_cast<const std::string*>(&recorder.log), &file}) {
    EXPECT_NE(log->find("not json, just a log line"), std::string::npos) << *log;
    EXPECT_NE(log->find("fake trainer ok: job job-1 rank 0 of 2"), std::string::npos) << *log;
    EXPECT_NE(log->find("\"step\":{\"step\":"), std::string::npos) << *log;
  }
}

TEST_F(TrainerProcessTest, CrashReportsExitCode) {
  Recorder recorder;
  auto process = TrainerProcess::Start(Prepare(MakeRun("crash")), recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  ASSERT_TRUE((*process)->WaitForExit(std::chrono::seconds(20)));
  std::lock_guard<std::mutex> lock(recorder.mu);
  ASSERT_EQ(recorder.exits.size(), 1u);
  EXPECT_EQ(recorder.exits[0].exit_code, 3);
  EXPECT_EQ(recorder.exits[0].reason, "exited with code 3: boom");
  EXPECT_NE(recorder.log.find("boom"), std::string::npos);
}

TEST_F(TrainerProcessTest, StopKillsTheProcessGroup) {
  const TrainerCommand command = Prepare(MakeRun("sleep"));
  Recorder recorder;
  auto process = TrainerProcess::Start(command, recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  const pid_t child = WaitForChildPid();
  ASSERT_TRUE(Alive(child));
  (*process)->Stop("cancelled", std::chrono::seconds(10), TrainerProcess::StopCause::kCoordinator);
  ASSERT_TRUE((*process)->WaitForExit(std::chrono::seconds(5)));
  {
    std::lock_guard<std::mutex> lock(recorder.mu);
    ASSERT_EQ(recorder.exits.size(), 1u);
    EXPECT_EQ(recorder.exits[0].exit_code, -1);
    EXPECT_EQ(recorder.exits[0].signal, SIGTERM);
    EXPECT_EQ(recorder.exits[0].reason, "cancelled");
    EXPECT_FALSE(recorder.exits[0].worker_stopping);  // the job's own business
  }
  for (int i = 0; i < 100 && Alive(child); ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(Alive(child)) << "the trainer's child survived";
}

TEST_F(TrainerProcessTest, StopEscalatesToSigkill) {
  const TrainerCommand command = Prepare(MakeRun("stubborn"));
  Recorder recorder;
  auto process = TrainerProcess::Start(command, recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  const pid_t child = WaitForChildPid();
  (*process)->Stop("worker shutting down", milliseconds(300),
                   TrainerProcess::StopCause::kWorkerShutdown);
  ASSERT_TRUE((*process)->WaitForExit(std::chrono::seconds(5)));
  ExpectKilledWithItsChild(recorder, child);
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.exits.at(0).reason, "worker shutting down");
  EXPECT_TRUE(recorder.exits.at(0).worker_stopping);  // the job was not at fault
}

// A restarted agent ends what its predecessor left: the trainer's whole group, found by its pid
// file, but neither a process that merely got a recorded pid nor what a trainer could write.
TEST_F(TrainerProcessTest, LeftoverTrainersAreEnded) {
  const TrainerCommand command = Prepare(MakeRun("sleep"));
  Recorder recorder;
  auto process = TrainerProcess::Start(command, recorder.Callbacks());
  ASSERT_TRUE(process.ok()) << process.status();
  const pid_t child = WaitForChildPid();
  const std::string recorded = ReadAll(command.pid_path);
  ASSERT_EQ(recorded.rfind(std::to_string((*process)->pid()) + " ", 0), 0u) << recorded;

  const std::string work = dir_.path() + "/work";
  std::filesystem::rename(command.pid_path, work + "/kept-aside");
  std::filesystem::create_directories(work + "/job-2/0");
  std::ofstream(work + "/job-2/0/rank0.pid") << getpid() << " 1\n";  // not our start time
  std::filesystem::create_directories(work + "/job-1/checkpoints");
  std::ofstream(work + "/job-1/checkpoints/rank0.pid") << recorded;  // a trainer's own file
  EXPECT_TRUE(EndLeftoverTrainers(work).empty());
  EXPECT_TRUE(Alive((*process)->pid()));
  EXPECT_FALSE(std::filesystem::exists(work + "/job-2/0/rank0.pid"));
  EXPECT_TRUE(std::filesystem::exists(work + "/job-1/checkpoints/rank0.pid"));

  std::filesystem::rename(work + "/kept-aside", command.pid_path);
  EXPECT_EQ(EndLeftoverTrainers(work), std::vector<pid_t>{(*process)->pid()});
  ASSERT_TRUE((*process)->WaitForExit(std::chrono::seconds(5)));
  ExpectKilledWithItsChild(recorder, child);
  EXPECT_FALSE(std::filesystem::exists(command.pid_path));
}

TEST_F(TrainerProcessTest, MissingProgramIsAnError) {
  TrainerCommand command = Prepare(MakeRun("ok"));
  command.program = dir_.path() + "/no-such-trainer";
  Recorder recorder;
  auto process = TrainerProcess::Start(command, recorder.Callbacks());
  ASSERT_FALSE(process.ok());
  EXPECT_NE(process.status().message().find("no-such-trainer"), std::string::npos);
  EXPECT_EQ(recorder.started, 0);
}

}  // namespace
}  // namespace hyscale::agent
