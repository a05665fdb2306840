// The hyscale command line: parses flags, builds the Context and runs one subcommand. main()
// only wires the process's streams; tests call RunCli directly.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace hyscale::cli {

struct Terminal {
  bool is_terminal = false;  // stdout is a terminal
  int columns = 100;
};

// `args` without the program name. Returns the exit code (client/exit_codes.h).
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           Terminal terminal = {});

}  // namespace hyscale::cli
