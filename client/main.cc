// hyscale: the HyScale command line. See `hyscale --help`; exit codes in client/exit_codes.h.
#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>

#include "client/cli.h"

int main(int argc, char** argv) {
  hyscale::cli::Terminal terminal;
  terminal.is_terminal = isatty(STDOUT_FILENO) == 1;
  winsize size{};
  if (terminal.is_terminal && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    terminal.columns = size.ws_col;
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  return hyscale::cli::RunCli(args, std::cout, std::cerr, terminal);
}
