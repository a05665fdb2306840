#include "util/subprocess.h"

#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "util/temp_dir.h"

namespace hyscale::util {
namespace {

using std::chrono::milliseconds;

Command Shell(const std::string& script) {
  return Command{{"/bin/sh", "-c", script}};
}

std::string Output(Command command) {
  auto run = RunAndCapture(std::move(command), std::chrono::seconds(20));
  EXPECT_TRUE(run.ok()) << run.status();
  return run.ok() ? run->output : "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A process that exists and is not a zombie.
bool Alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

bool DiesWithin(pid_t pid, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Alive(pid) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  return !Alive(pid);
}

// The pid a script wrote to `path` (it starts in the background), once it is there.
pid_t PidFrom(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    const std::string text = ReadAll(path);
    if (!text.empty() && text.back() == '\n') return std::stoi(text);
    std::this_thread::sleep_for(milliseconds(10));
  }
  return -1;
}

class SubprocessTest : public ::testing::Test {
 protected:
  TempDir dir_ = TempDir::Create("util-subprocess").value();
};

TEST_F(SubprocessTest, ReportsExitCodesAndSignals) {
  auto exited = Subprocess::Start(Shell("exit 7"));
  ASSERT_TRUE(exited.ok()) << exited.status();
  const ExitStatus code = exited->Wait();
  EXPECT_EQ(code.exit_code, 7);
  EXPECT_EQ(code.signal, 0);
  EXPECT_EQ(code.ShellCode(), 7);
  EXPECT_FALSE(code.Succeeded());

  auto killed = Subprocess::Start(Shell("kill -9 $$"));
  ASSERT_TRUE(killed.ok()) << killed.status();
  const ExitStatus signal = killed->Wait();
  EXPECT_EQ(signal.exit_code, -1);
  EXPECT_EQ(signal.signal, SIGKILL);
  EXPECT_EQ(signal.ShellCode(), 128 + SIGKILL);
  EXPECT_EQ(killed->Wait().signal, SIGKILL);  // reaped once, reported again
}

TEST_F(SubprocessTest, AMissingProgramIsAnErrorNamingIt) {
  const std::string program = dir_.Path("no-such-program");
  auto process = Subprocess::Start(Command{{program}});
  ASSERT_FALSE(process.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(process.status())) << process.status();
  EXPECT_NE(process.status().message().find(program + ": cannot execute"), std::string::npos)
      << process.status();
}

TEST_F(SubprocessTest, CapturesStdoutAndOnRequestStderr) {
  EXPECT_EQ(Output(Shell("echo out; echo err >&2")), "out\n");
  Command both = Shell("echo out; echo err >&2");
  both.stderr_to = Redirect::ToStdout();
  EXPECT_EQ(Output(both), "out\nerr\n");
  Command quiet = Shell("echo out; echo err >&2");
  quiet.stderr_to = Redirect::Null();
  EXPECT_EQ(Output(quiet), "out\n");
}

TEST_F(SubprocessTest, ReadsNothingFromOurStdin) {
  EXPECT_EQ(Output(Command{{"/bin/cat"}}), "");
}

TEST_F(SubprocessTest, SetsAndUnsetsEnvironmentVariables) {
  ::setenv("UTIL_TEST_KEPT", "kept", 1);
  ::setenv("UTIL_TEST_REPLACED", "old", 1);
  ::setenv("UTIL_TEST_GONE", "gone", 1);
  ::setenv("UTIL_TEST_GONE_NOT", "prefix only", 1);
  Command command = Shell(
      "echo \"$UTIL_TEST_KEPT|$UTIL_TEST_REPLACED|${UTIL_TEST_GONE-unset}|$UTIL_TEST_GONE_NOT|"
      "$UTIL_TEST_NEW\"");
  command.env = {{"UTIL_TEST_REPLACED", "new"}, {"UTIL_TEST_NEW", "a=b"}};
  command.unset_env = {"UTIL_TEST_GONE"};
  EXPECT_EQ(Output(command), "kept|new|unset|prefix only|a=b\n");
}

TEST_F(SubprocessTest, WritesOrAppendsOutputToFiles) {
  const std::string log = dir_.Path("log");
  std::ofstream(log) << "before\n";
  Command append = Shell("echo out; echo err >&2");
  append.stdout_to = Redirect::AppendTo(log);
  append.stderr_to = Redirect::ToStdout();
  ASSERT_TRUE(Subprocess::Start(append).value().Wait().Succeeded());
  EXPECT_EQ(ReadAll(log), "before\nout\nerr\n");

  Command truncate = Shell("echo err >&2");
  truncate.stderr_to = Redirect::WriteTo(log);
  ASSERT_TRUE(Subprocess::Start(truncate).value().Wait().Succeeded());
  EXPECT_EQ(ReadAll(log), "err\n");
}

TEST_F(SubprocessTest, AnUnopenableOutputFileIsAnError) {
  Command command = Shell("true");
  command.stdout_to = Redirect::AppendTo(dir_.Path("missing/log"));
  auto process = Subprocess::Start(command);
  ASSERT_FALSE(process.ok());
  EXPECT_NE(process.status().message().find("missing/log: cannot open"), std::string::npos);
}

TEST_F(SubprocessTest, PipesAreReadByTheParent) {
  Command command = Shell("echo to-out; echo to-err >&2");
  command.stdout_to = Redirect::Pipe();
  command.stderr_to = Redirect::Pipe();
  auto process = Subprocess::Start(command);
  ASSERT_TRUE(process.ok()) << process.status();
  const auto read_all = [](UniqueFd fd) {
    std::string text;
    char buffer[256];
    ssize_t n;
    while ((n = ::read(fd.get(), buffer, sizeof buffer)) > 0) text.append(buffer, n);
    return text;
  };
  EXPECT_EQ(read_all(process->TakeStdout()), "to-out\n");
  EXPECT_EQ(read_all(process->TakeStderr()), "to-err\n");
  EXPECT_FALSE(process->TakeStdout().valid());  // taken
  EXPECT_TRUE(process->Wait().Succeeded());
}

TEST_F(SubprocessTest, ANewProcessGroupIsSignalledWhole) {
  const std::string child_pid = dir_.Path("child.pid");
  Command command = Shell("sleep 30 & echo $! > " + child_pid + "; wait");
  command.new_process_group = true;
  auto process = Subprocess::Start(command);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(::getpgid(process->pid()), process->pid());
  const pid_t child = PidFrom(child_pid);
  ASSERT_GT(child, 0);
  EXPECT_EQ(::getpgid(child), process->pid());
  process->SignalGroup(SIGKILL);
  EXPECT_EQ(process->Wait().signal, SIGKILL);
  EXPECT_TRUE(DiesWithin(child, milliseconds(2000)));
}

TEST_F(SubprocessTest, WithoutANewGroupItSharesOurs) {
  auto process = Subprocess::Start(Shell("sleep 30"));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(::getpgid(process->pid()), ::getpgrp());
}

// The parent-death signal reaches the child when its parent (here a forked process that starts
// it and exits at once) dies.
TEST_F(SubprocessTest, TheParentDeathSignalEndsAnOrphan) {
  const std::string child_pid = dir_.Path("child.pid");
  const auto started = RunInChild([&] {
    Command command = Shell("echo $$ > " + child_pid + "; exec sleep 30");
    command.parent_death_signal = SIGKILL;
    auto process = Subprocess::Start(command);
    if (!process.ok()) return 1;
    while (ReadAll(child_pid).empty()) std::this_thread::sleep_for(milliseconds(10));
    ::_exit(0);  // no destructor: the child outlives us only without the signal
  });
  ASSERT_EQ(started.value(), 0);
  const pid_t child = PidFrom(child_pid);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(DiesWithin(child, milliseconds(5000)));
}

TEST_F(SubprocessTest, TheChildSeesSignalsWeBlockOrIgnore) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigset_t old;
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  const auto old_pipe = ::signal(SIGPIPE, SIG_IGN);
  auto process = Subprocess::Start(Shell("exec sleep 30"));
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::signal(SIGPIPE, old_pipe);
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_EQ(process->Stop(std::chrono::seconds(10)).signal, SIGTERM);

  auto piped = RunAndCapture(Shell("yes | head -c 1 >/dev/null; kill -0 $$; echo done"));
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ(piped->output, "done\n");  // `yes` ended by SIGPIPE, as in any shell
}

TEST_F(SubprocessTest, StopEscalatesToSigkill) {
  auto process = Subprocess::Start(Shell("trap '' TERM; exec sleep 30"));
  ASSERT_TRUE(process.ok()) << process.status();
  std::this_thread::sleep_for(milliseconds(100));  // the trap is set
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(process->Stop(milliseconds(300)).signal, SIGKILL);
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(300));
}

TEST_F(SubprocessTest, WaitForTimesOutAndTryWaitDoesNotBlock) {
  auto process = Subprocess::Start(Shell("exec sleep 30"));
  ASSERT_TRUE(process.ok()) << process.status();
  EXPECT_FALSE(process->TryWait().has_value());
  EXPECT_FALSE(process->WaitFor(milliseconds(50)).has_value());
  process->Signal(SIGTERM);
  const auto exit = process->WaitFor(std::chrono::seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST_F(SubprocessTest, HasExitedLeavesTheProcessUnreaped) {
  auto process = Subprocess::Start(Shell("exit 3"));
  ASSERT_TRUE(process.ok()) << process.status();
  while (!process->HasExited()) std::this_thread::sleep_for(milliseconds(5));
  const std::string stat = ReadAll("/proc/" + std::to_string(process->pid()) + "/stat");
  EXPECT_NE(stat.find(") Z "), std::string::npos) << stat;  // a zombie: its pid stays taken
  EXPECT_EQ(process->Wait().exit_code, 3);
  EXPECT_TRUE(process->HasExited());
}

TEST_F(SubprocessTest, DestroyingAProcessKillsAndReapsIt) {
  pid_t pid = -1;
  {
    auto process = Subprocess::Start(Shell("exec sleep 30"));
    ASSERT_TRUE(process.ok()) << process.status();
    pid = process->pid();
  }
  EXPECT_NE(::kill(pid, 0), 0);  // gone, not even a zombie
}

TEST_F(SubprocessTest, CaptureKillsAtTheTimeout) {
  Command command = Shell("echo early; exec sleep 30");
  auto run = RunAndCapture(command, milliseconds(300));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->timed_out);
  EXPECT_EQ(run->exit.signal, SIGKILL);
  EXPECT_EQ(run->output, "early\n");
}

TEST_F(SubprocessTest, RunsAsAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  const passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  Command command{{"/usr/bin/id", "-u"}};
  command.run_as = RunAs{"nobody", nobody->pw_uid, nobody->pw_gid};
  EXPECT_EQ(Output(command), std::to_string(nobody->pw_uid) + "\n");
  // nobody cannot enter the 0700 scratch folder: the error names the user.
  const std::string script = dir_.Path("script.sh");
  std::ofstream(script) << "#!/bin/sh\n";
  ::chmod(script.c_str(), 0755);
  command.argv = {script};
  auto process = Subprocess::Start(command);
  ASSERT_FALSE(process.ok());
  EXPECT_NE(process.status().message().find("cannot execute as nobody"), std::string::npos)
      << process.status();
}

TEST_F(SubprocessTest, RunInChildReturnsTheBodysCode) {
  EXPECT_EQ(RunInChild([] { return 0; }).value(), 0);
  EXPECT_EQ(RunInChild([] { return 4; }).value(), 4);
  EXPECT_FALSE(RunInChild([] { return ::raise(SIGKILL); }).ok());
}

TEST_F(SubprocessTest, FindExecutableSearchesPathForBareNames) {
  EXPECT_EQ(FindExecutable("./relative/name"), "./relative/name");
  EXPECT_EQ(FindExecutable("no-such-program-anywhere"), "");
  const std::string found = FindExecutable("sh");
  EXPECT_FALSE(found.empty());
  EXPECT_EQ(::access(found.c_str(), X_OK), 0) << found;
  std::ofstream(dir_.Path("not-executable")) << "#!/bin/sh\n";
  const std::string path = ::getenv("PATH");
  ::setenv("PATH", dir_.path().c_str(), 1);
  EXPECT_EQ(FindExecutable("not-executable"), "");
  ::setenv("PATH", path.c_str(), 1);
}

}  // namespace
}  // namespace hyscale::util
