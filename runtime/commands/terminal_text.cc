// Terminal text: see terminal_text.h.
#include "runtime/commands/terminal_text.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "base/env.h"
#include "base/logging.h"
#include "base/signals.h"

namespace strata::runtime {

int TerminalColumns(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* env = GetEnv("COLUMNS")) {
    char* end = nullptr;
    const long cols = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && cols >= 1 && cols <= 100000) return static_cast<int>(cols);
  }
  return 80;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

std::string FitProgressLine(const std::vector<LineField>& fields, double fraction, int columns) {
  constexpr int kMaxBar = 24, kMinBar = 6;  // cells inside the brackets
  const int room = std::max(1, columns - 1);
  int max_priority = 0;
  for (const LineField& f : fields) max_priority = std::max(max_priority, f.priority);
  // The fields up to `cut`, joined; their length.
  auto join = [&](int cut) {
    std::string text;
    for (const LineField& f : fields) {
      if (f.priority > cut || f.text.empty()) continue;
      if (!text.empty()) text += "  ";
      text += f.text;
    }
    return text;
  };
  // The most fields that fit beside the smallest bar; else the most that fit alone.
  std::string text = join(0);
  bool bar = false;
  for (int cut = max_priority; cut >= 0; --cut) {
    std::string t = join(cut);
    if (static_cast<int>(t.size()) + kMinBar + 3 <= room) {
      text = std::move(t);
      bar = true;
      break;
    }
  }
  if (!bar) {
    for (int cut = max_priority; cut >= 0; --cut) {
      std::string t = join(cut);
      if (static_cast<int>(t.size()) <= room || cut == 0) {
        text = std::move(t);
        break;
      }
    }
  }
  if (!bar) return text.substr(0, static_cast<size_t>(room));
  const int cells = std::min(kMaxBar, room - static_cast<int>(text.size()) - 3);
  const double f = std::clamp(std::isfinite(fraction) ? fraction : 0.0, 0.0, 1.0);
  const int filled = static_cast<int>(cells * f);
  return "[" + std::string(filled, '#') + std::string(cells - filled, '.') + "] " + text;
}

std::string WrapSegments(const std::vector<std::string>& segments, int columns,
                         const std::string& indent, const std::string& separator) {
  std::string out;
  size_t line = 0;  // characters on the current line
  for (const std::string& s : segments) {
    if (s.empty()) continue;
    if (line == 0) {
      out += s;
      line = s.size();
    } else if (line + separator.size() + s.size() <= static_cast<size_t>(columns)) {
      out += separator + s;
      line += separator.size() + s.size();
    } else {
      out += "\n" + indent + s;
      line = indent.size() + s.size();
    }
  }
  return out;
}

void EtaEstimator::Add(int64_t step, double elapsed_seconds) {
  if (last_step_ >= 0 && step > last_step_ && elapsed_seconds >= last_elapsed_) {
    per_step_.push_back((elapsed_seconds - last_elapsed_) / static_cast<double>(step - last_step_));
    while (static_cast<int>(per_step_.size()) > window_) per_step_.pop_front();
  } else if (last_step_ < 0 && step > 0 && elapsed_seconds > 0) {
    // The first report: Run's clock started with this step (a resumed run too).
    per_step_.push_back(elapsed_seconds);
  }
  last_step_ = step;
  last_elapsed_ = elapsed_seconds;
}

double EtaEstimator::SecondsLeft(int64_t steps) const {
  if (per_step_.empty() || last_step_ < 0) return -1;
  double sum = 0;
  for (double s : per_step_) sum += s;
  return static_cast<double>(std::max<int64_t>(0, steps - last_step_)) * sum /
         static_cast<double>(per_step_.size());
}

InterruptNotice::InterruptNotice(const std::atomic<bool>* stop, std::string save_dir, bool enabled)
    : stop_(stop), save_dir_(std::move(save_dir)), enabled_(enabled && stop != nullptr) {
  if (enabled_) thread_ = std::thread([this] { Watch(); });
}

InterruptNotice::~InterruptNotice() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string InterruptNotice::Message() const {
  const std::string again = InterruptSignal() == SIGTERM ? " — a second SIGTERM stops now"
                                                         : " — Ctrl-C again to stop now";
  switch (static_cast<Phase>(phase_.load())) {
    case Phase::kSetUp:
      return "interrupted during set-up: stopping after the current stage (nothing is trained or "
             "saved)" +
             again;
    case Phase::kTraining:
      return "interrupted: finishing step " + std::to_string(step_.load()) +
             (save_dir_.empty() ? ", then stopping" : ", then saving to " + save_dir_) + again;
    case Phase::kFinishing:
      return std::string("interrupted: ") +
             (save_dir_.empty() ? "stopping" : "finishing the save to " + save_dir_) + again;
  }
  return "interrupted" + again;
}

void InterruptNotice::Poll() {
  if (!enabled_ || !stop_->load() || said_.exchange(true)) return;
  STRATA_LOG(kWarning) << Message();
}

void InterruptNotice::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_ && !said_.load()) {
    Poll();
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

}  // namespace strata::runtime
