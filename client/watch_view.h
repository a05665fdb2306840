// Shows a job's events as they arrive: on a terminal a progress bar and a per-phase breakdown
// redrawn in place under the event lines; otherwise one plain line per event; with -o json one
// JobEvent JSON document per line.
#pragma once

#include <optional>
#include <string>

#include "client/context.h"

namespace hyscale::cli {

class WatchView {
 public:
  explicit WatchView(const Context& context) : context_(context) {}

  void Show(const v1::JobEvent& event);
  // Leaves the bar on screen and ends its line.
  void Finish();

 private:
  void Print(const std::string& line);  // an event line above the bar
  void ClearBar();
  void DrawBar();

  const Context& context_;
  // The last step event of the lowest rank seen: the bar follows it.
  std::optional<v1::TrainerEvent> last_step_;
  int bar_lines_ = 0;  // lines the bar occupies now (0, 1 or 2)
};

}  // namespace hyscale::cli
