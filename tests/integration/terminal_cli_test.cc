// What `strata train` shows on a terminal, through the binary on a pseudo-terminal (forkpty):
//   - at 80 columns no row the terminal shows is longer than 80 (the progress line is redrawn in
//     place and must not wrap), the progress line shows the elapsed time and an ETA, it leaves
//     no debris in the rows that stay, and the stdout step lines wrap to 80 with all their fields;
//   - at 200 columns the progress line has more fields (the tiers);
//   - not on a terminal: no "\r" at all, one plain line per print step; --log-json has the epoch
//     and the elapsed time;
//   - under --nproc 2, info lines appear once (rank 0's) and a config error once;
//   - Ctrl-C says at once what happens next (the step it finishes and where it saves), exits 130,
//     and that step's checkpoint exists.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::Strata;
using strata::testing::TempDir;

namespace fs = std::filesystem;

struct PtyRun {
  int rc = -1;  // exit code; -1 when a signal ended it
  std::string out;
};

// Runs `strata args...` with stdout and stderr on a pseudo-terminal `cols` columns wide. After
// each read, `on_output(out so far, master fd)` may act (write a Ctrl-C to the terminal). Gives
// up (SIGKILL) after `timeout_s`.
PtyRun RunOnPty(const std::vector<std::string>& args, int cols,
                const std::function<void(const std::string&, int)>& on_output = {},
                int timeout_s = 180) {
  PtyRun run;
  winsize ws{};
  ws.ws_row = 40;
  ws.ws_col = static_cast<unsigned short>(cols);
  std::vector<std::string> argv_s = {STRATA_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &ws);
  if (pid < 0) return run;
  if (pid == 0) {
    ::unsetenv("COLUMNS");  // the width comes from the terminal
    ::execv(STRATA_BINARY, argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    pollfd p{master, POLLIN, 0};
    const int n = ::poll(&p, 1, 100);
    if (n > 0) {
      char buf[4096];
      const ssize_t got = ::read(master, buf, sizeof(buf));
      if (got <= 0) break;  // EIO: every process holding the terminal is gone
      run.out.append(buf, static_cast<size_t>(got));
    }
    if (on_output) on_output(run.out, master);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) run.rc = WEXITSTATUS(status);
  return run;
}

// Columns of a UTF-8 text (code points; the output has no wide characters).
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// What a terminal shows for `out`, rows not wrapped (so one longer than the terminal shows as
// such): `shown` is every state a row was in just before "\r", "\x1b[K" or a newline (what was
// on the screen at some moment); `kept` are the rows a newline ended (what stays in the scroll).
struct Screen {
  std::vector<std::string> shown, kept;
};
Screen Interpret(const std::string& out) {
  Screen s;
  std::string row;
  size_t cursor = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (c == '\r') {
      s.shown.push_back(row);
      cursor = 0;
    } else if (c == '\n') {
      s.shown.push_back(row);
      s.kept.push_back(row);
      row.clear();
      cursor = 0;
    } else if (c == '\x1b' && out.compare(i, 3, "\x1b[K") == 0) {
      s.shown.push_back(row);
      row.resize(cursor);
      i += 2;
    } else {
      if (cursor < row.size()) {
        row[cursor] = c;
      } else {
        row.push_back(c);
      }
      ++cursor;
    }
  }
  if (!row.empty()) {
    s.shown.push_back(row);
    s.kept.push_back(row);
  }
  return s;
}

// The rows that stay, with lines a wrapped message continues on (indented by four spaces) joined
// back to the line they continue: one line per message.
std::string Unwrapped(const std::string& out) {
  std::string text;
  for (const std::string& row : Interpret(out).kept) {
    if (row.rfind("    ", 0) == 0 && !text.empty()) {
      text.back() = ' ';
      text += row.substr(4);
    } else {
      text += row;
    }
    text += '\n';
  }
  return text;
}

std::string Longest(const std::vector<std::string>& rows) {
  std::string longest;
  for (const std::string& r : rows) {
    if (Columns(r) > Columns(longest)) longest = r;
  }
  return longest;
}

bool AnyMatches(const std::vector<std::string>& rows, const std::regex& re) {
  for (const std::string& r : rows) {
    if (std::regex_search(r, re)) return true;
  }
  return false;
}

class TerminalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    fs::create_directories(dir_ + "/nvme");
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i) data << "The quick brown fox " << i << " jumps over the dog.\n";
    std::ofstream eval(dir_ + "/eval.txt");
    for (int i = 0; i < 60; ++i) eval << "A lazy dog " << i << " sleeps in the sun.\n";
  }

  std::vector<std::string> Train(int steps, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "train", "--model", "tiny", "--steps", std::to_string(steps), "--data", dir_ + "/data.txt"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  TempDir tmp_{"strata-terminal"};
  std::string dir_;
};

TEST_F(TerminalCliTest, EightyColumnsShowNoRowLongerThanEighty) {
  const PtyRun r = RunOnPty(Train(25), 80);
  ASSERT_EQ(r.rc, 0) << r.out;
  const Screen screen = Interpret(r.out);
  const std::string longest = Longest(screen.shown);
  EXPECT_LE(Columns(longest), 80u) << "shown: '" << longest << "'\n" << r.out;
  // The progress line was drawn with the elapsed time and an ETA.
  EXPECT_TRUE(AnyMatches(screen.shown, std::regex(R"(\] +\d+/25  loss .*elapsed \d+:\d\d  ETA )"
                                                  R"(\d+:\d\d)")))
      << r.out;
  // ... and erased before each line that stays: none of them holds a piece of it.
  for (const std::string& row : screen.kept) {
    EXPECT_EQ(row.find("ETA "), std::string::npos) << "debris: '" << row << "'";
    EXPECT_EQ(row.find("] "), std::string::npos) << "debris: '" << row << "'";
  }
  // The step lines (every 20 steps, the demo's steps_per_print, and the last) keep all their
  // figures, wrapped to 80.
  for (const std::string step : {"step 20  loss ", "step 25  loss "}) {
    EXPECT_TRUE(AnyMatches(screen.kept, std::regex("^" + step))) << step << r.out;
  }
  EXPECT_TRUE(AnyMatches(screen.kept, std::regex(R"(^    .*NVMe read .* written )"))) << r.out;
  EXPECT_TRUE(AnyMatches(screen.kept, std::regex(R"(\d tok/s)"))) << r.out;
  EXPECT_TRUE(AnyMatches(screen.kept, std::regex(R"(= fwd [\d.]+ \+ bwd [\d.]+ \+ opt [\d.]+)")))
      << r.out;
  EXPECT_TRUE(AnyMatches(screen.kept, std::regex("^done after 25 steps"))) << r.out;
}

TEST_F(TerminalCliTest, TwoHundredColumnsShowMoreFields) {
  const std::regex tiers(R"(NVMe r .* GB/s w .*  device .*/.*  pinned .*/)");
  const PtyRun wide =
      RunOnPty(Train(5, {"--eval-data", dir_ + "/eval.txt", "--eval-every", "2"}), 200);
  ASSERT_EQ(wide.rc, 0) << wide.out;
  const Screen w = Interpret(wide.out);
  EXPECT_LE(Columns(Longest(w.shown)), 200u) << wide.out;
  EXPECT_TRUE(AnyMatches(w.shown, tiers)) << wide.out;
  EXPECT_TRUE(AnyMatches(w.shown, std::regex(R"(\] 5/5  loss .*elapsed .*ETA .*tok/s)")))
      << wide.out;
  // After the evaluation of step 2, its loss and perplexity.
  EXPECT_TRUE(AnyMatches(w.shown, std::regex(R"(\] 3/5  .*tok/s  eval \d+\.\d{4} ppl \d+\.\d\d)")))
      << wide.out;
  const PtyRun narrow = RunOnPty(Train(5), 80);
  ASSERT_EQ(narrow.rc, 0) << narrow.out;
  EXPECT_FALSE(AnyMatches(Interpret(narrow.out).shown, tiers)) << narrow.out;
}

TEST_F(TerminalCliTest, NotATerminalGetsPlainLines) {
  const std::string log = dir_ + "/steps.jsonl";
  const CliRun r = Strata("train --model tiny --steps 12 --data " + dir_ + "/data.txt --log-json " +
                          log + " --eval-data " + dir_ + "/eval.txt --eval-every 6 < /dev/null");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b["), std::string::npos) << r.out;
  // One line per print step, every figure on it.
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(\nstep 12  loss [\d.]+ \(avg [\d.]+\)  lr \S+  \d+ tok/s  step )"
                        R"([\d.]+s = fwd [\d.]+ \+ bwd [\d.]+ \+ opt [\d.]+  NVMe read .*\n)")))
      << r.out;
  const std::vector<nlohmann::json> records = JsonLines(log);
  ASSERT_EQ(records.size(), 12u);
  double last = 0, last_epoch = 0;
  for (const nlohmann::json& j : records) {
    const double elapsed = j.at("elapsed_seconds").get<double>();
    EXPECT_GT(elapsed, last) << j.dump();  // from Run's start, growing
    last = elapsed;
    const double epoch = j.at("epoch").get<double>();
    EXPECT_GT(epoch, last_epoch) << j.dump();
    last_epoch = epoch;
    // Evaluated after steps 6 and 12: the record and a stdout line say so, with the same loss.
    const int64_t step = j.at("step").get<int64_t>();
    ASSERT_EQ(j.contains("eval_loss"), step % 6 == 0) << j.dump();
    if (step % 6 != 0) continue;
    const double loss = j.at("eval_loss").get<double>();
    EXPECT_NEAR(j.at("eval_perplexity").get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
    char line[96];
    std::snprintf(line, sizeof(line), "\neval  step %lld  loss %.4f  ppl %.2f  (",
                  static_cast<long long>(step), loss, std::exp(loss));
    EXPECT_NE(r.out.find(line), std::string::npos) << line << r.out;
  }
}

#if STRATA_HAVE_GLOO
TEST_F(TerminalCliTest, RanksPrintInfoLinesOnceAndAConfigErrorOnce) {
  const std::string head =
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "strata": {"comms_timeout_seconds": 60},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
      dir_ + R"(/nvme"}})";
  std::ofstream(dir_ + "/ranks.json") << head << "}";
  const CliRun ok = Strata("train --model tiny --nproc 2 --steps 2 --quiet --data " + dir_ +
                           "/data.txt --config " + dir_ + "/ranks.json");
  ASSERT_EQ(ok.rc, 0) << ok.out;
  std::map<std::string, int> info;  // info line text (without the rank prefix) -> count
  std::istringstream lines(ok.out);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("strata info: ");
    if (at != std::string::npos) ++info[line.substr(at)];
  }
  EXPECT_FALSE(info.empty()) << ok.out;
  for (const auto& [text, n] : info) EXPECT_EQ(n, 1) << text << "\n" << ok.out;
  EXPECT_EQ(ok.out.find("[rank 1] strata info"), std::string::npos) << ok.out;

  // A misspelt key: each rank finds it; it is shown once.
  std::ofstream(dir_ + "/bad.json") << head << R"(, "gradient_clippingg": 1.0})";
  const CliRun bad = Strata("train --model tiny --nproc 2 --steps 2 --quiet --data " + dir_ +
                            "/data.txt --config " + dir_ + "/bad.json");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  size_t count = 0;
  for (size_t at = 0; (at = bad.out.find("gradient_clippingg", at)) != std::string::npos; ++at) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << bad.out;
}
#endif

TEST_F(TerminalCliTest, CtrlCSaysWhatHappensNextThenSavesThatStep) {
  for (const bool save : {true, false}) {
    SCOPED_TRACE(save ? "--save" : "no --save");
    const std::string log = dir_ + "/ctrl-c-" + std::to_string(save) + ".jsonl";
    const std::string ck = dir_ + "/ck";
    std::vector<std::string> extra = {"--log-json", log};
    if (save) extra.insert(extra.end(), {"--save", ck});
    bool sent = false;
    // Ctrl-C typed on the terminal (its driver sends SIGINT to the foreground process group)
    // once the first step is logged.
    const PtyRun r = RunOnPty(Train(1000000, extra), 80, [&](const std::string&, int master) {
      if (sent || !fs::exists(log) || fs::file_size(log) == 0) return;
      ASSERT_EQ(::write(master, "\x03", 1), 1);
      sent = true;
    });
    ASSERT_TRUE(sent) << r.out;
    EXPECT_EQ(r.rc, 130) << r.out;
    std::smatch m;
    const std::string then = save ? "saving to " + ck : std::string("stopping");
    const std::string text = Unwrapped(r.out);
    ASSERT_TRUE(std::regex_search(text, m,
                                  std::regex("interrupted: finishing step (\\d+), then " + then +
                                             " — Ctrl-C again to stop now")))
        << r.out;
    const std::string step = m[1];
    if (save) {
      EXPECT_TRUE(fs::exists(ck + "/step-" + step)) << r.out;
      // Said when Ctrl-C came, before the save.
      EXPECT_LT(text.find("finishing step"), text.find("saved step " + step)) << r.out;
    }
    EXPECT_NE(text.find("stopped (interrupted) after " + step + " steps"), std::string::npos)
        << r.out;
  }
}

}  // namespace
}  // namespace strata
