#include "client/watch_view.h"

#include <map>

#include "client/format.h"

namespace hyscale::cli {
namespace {

constexpr char kClearLine[] = "\r\033[K";
constexpr char kLineUp[] = "\033[1A";

std::string Fit(const std::string& line, int columns) {
  return columns > 1 && static_cast<int>(line.size()) >= columns
             ? line.substr(0, static_cast<size_t>(columns - 1))
             : line;
}

}  // namespace

void WatchView::Show(const v1::JobEvent& event) {
  if (context_.json()) {
    PrintJson(context_, event, /*one_line=*/true);
    return;
  }
  if (!context_.terminal) {
    *context_.out << DescribeEvent(event) << "\n" << std::flush;
    return;
  }
  const v1::TrainerEvent& trainer = event.trainer();
  if (trainer.event().has_step()) {
    if (!last_step_ || trainer.rank() <= last_step_->rank()) last_step_ = trainer;
    if (trainer.event().step().has_evaluation()) Print(DescribeEvent(event));
    ClearBar();
    DrawBar();
    return;
  }
  Print(DescribeEvent(event));
}

void WatchView::Finish() {
  if (bar_lines_ > 0) *context_.out << "\n" << std::flush;
  bar_lines_ = 0;
}

void WatchView::Print(const std::string& line) {
  ClearBar();
  *context_.out << Fit(line, context_.terminal_columns) << "\n";
  DrawBar();
}

void WatchView::ClearBar() {
  for (int i = 0; i < bar_lines_; ++i) {
    *context_.out << kClearLine;
    if (i + 1 < bar_lines_) *context_.out << kLineUp;
  }
  bar_lines_ = 0;
}

void WatchView::DrawBar() {
  if (!last_step_) {
    *context_.out << std::flush;
    return;
  }
  const int columns = context_.terminal_columns;
  const v1::TrainerEventLine::Step& step = last_step_->event().step();
  *context_.out << Fit(ProgressBar(step, 30), columns);
  bar_lines_ = 1;
  const std::map<std::string, double> phases(step.phase_seconds().begin(),
                                             step.phase_seconds().end());
  if (!phases.empty()) {
    *context_.out << "\n" << Fit(PhaseBreakdown(phases, 30), columns);
    bar_lines_ = 2;
  }
  *context_.out << std::flush;
}

}  // namespace hyscale::cli
