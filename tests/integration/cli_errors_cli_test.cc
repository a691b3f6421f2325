// Command-line mistakes through the binary (runtime/commands/command.h): one line on stderr,
// "strata <command>: ...", naming the mistake and the closest flag or command, exit code 2.
// The commands and their flags are read from the binary's own --help, so every command and group
// subcommand is covered, also those added later: each long flag is misspelled (two inner letters
// swapped) and the error must name it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Shell;

// A hang shows up as rc 124 from timeout(1) instead of a stuck test.
CliRun Strata(const std::string& args) {
  return Shell("timeout 60 " + std::string(STRATA_BINARY) + " " + args);
}

// The lines of one section of a --help text ("Options:", "Subcommands:").
std::vector<std::string> Section(const std::string& help, const std::string& title) {
  std::vector<std::string> lines;
  std::istringstream in(help);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) {
      inside = false;
      continue;
    }
    if (line.back() == ':' && line[0] != ' ') {
      inside = line == title;
      continue;
    }
    if (inside) lines.push_back(line);
  }
  return lines;
}

std::string Help(const std::string& command) {
  CliRun help = Strata(command + " --help");
  EXPECT_EQ(help.rc, 0) << command << ": " << help.out;
  return help.out;
}

// The subcommands a --help lists.
std::vector<std::string> Subcommands(const std::string& help) {
  std::vector<std::string> names;
  const std::regex entry(R"(^  ([a-z][a-z0-9-]*)(\s|$))");
  for (const std::string& line : Section(help, "Subcommands:")) {
    std::smatch m;
    if (std::regex_search(line, m, entry)) names.push_back(m[1]);
  }
  return names;
}

// The long names of each option a --help lists ("--micro-batch,--batch-size" gives both).
std::vector<std::vector<std::string>> LongFlags(const std::string& help) {
  std::vector<std::vector<std::string>> flags;
  const std::regex entry(R"(^  (-[-A-Za-z0-9,]+))");
  for (const std::string& line : Section(help, "Options:")) {
    std::smatch m;
    if (!std::regex_search(line, m, entry)) continue;
    std::vector<std::string> names;
    std::istringstream parts(m[1].str());
    for (std::string name; std::getline(parts, name, ',');) {
      if (name.rfind("--", 0) == 0) names.push_back(name);
    }
    if (!names.empty()) flags.push_back(names);
  }
  return flags;
}

struct CommandInfo {
  std::string path;                             // "" for strata itself, "bench io"
  std::vector<std::string> subcommands;         // a group's
  std::vector<std::vector<std::string>> flags;  // long names, per option
};

// strata itself, every command and group, and every group's commands, from their --help.
std::vector<CommandInfo> AllCommands() {
  std::vector<CommandInfo> all;
  std::vector<std::string> todo = {""};
  while (!todo.empty()) {
    const std::string path = todo.back();
    todo.pop_back();
    const std::string help = Help(path);
    CommandInfo info{path, Subcommands(help), LongFlags(help)};
    for (const std::string& sub : info.subcommands) {
      todo.push_back(path.empty() ? sub : path + " " + sub);
    }
    all.push_back(std::move(info));
  }
  return all;
}

// `word` with two adjacent inner letters swapped ("steps" -> "stpes"); two letters that differ,
// the first and last kept where the word is long enough to. "" when no swap changes it.
std::string Swapped(const std::string& word) {
  auto swap_at = [&](size_t i) {
    std::string out = word;
    std::swap(out[i], out[i + 1]);
    return out;
  };
  for (size_t i = 1; i + 2 < word.size(); ++i) {
    if (word[i] != word[i + 1] && std::isalpha(word[i]) && std::isalpha(word[i + 1])) {
      return swap_at(i);
    }
  }
  for (size_t i = 0; i + 1 < word.size(); ++i) {
    if (word[i] != word[i + 1]) return swap_at(i);
  }
  return "";
}

// The names in "(did you mean a, b or c?)" at the end of `line`.
std::set<std::string> Suggested(const std::string& line) {
  std::set<std::string> names;
  const size_t start = line.find("(did you mean ");
  const size_t end = line.rfind("?)");
  if (start == std::string::npos || end == std::string::npos || end < start) return names;
  std::string list = line.substr(start + 14, end - start - 14);
  list = std::regex_replace(list, std::regex(" or |, "), " ");
  std::istringstream words(list);
  for (std::string w; words >> w;) names.insert(w);
  return names;
}

std::string Prefix(const std::string& path) { return path.empty() ? "strata" : "strata " + path; }

TEST(CliErrorsTest, TheInventoryReadsEveryCommand) {
  std::set<std::string> paths;
  size_t flags = 0;
  for (const CommandInfo& c : AllCommands()) {
    paths.insert(c.path);
    flags += c.flags.size();
  }
  for (const char* known : {"", "bench", "bench io", "bench adam", "bench tiers", "estimate",
                            "report", "tokenize", "tune-io", "clean"}) {
    EXPECT_TRUE(paths.count(known)) << "no `strata " << known << "` in the help texts";
  }
#if STRATA_HAVE_TORCH
  for (const char* known : {"train", "eval", "bench step", "bench comm"}) {
    EXPECT_TRUE(paths.count(known)) << "no `strata " << known << "` in the help texts";
  }
  EXPECT_GT(flags, 100u);
#else
  EXPECT_GT(flags, 40u);
#endif
}

// Every long flag of every command, misspelled: exit code 2, exactly one line, naming the command
// and suggesting that flag. Given as `--flag` and as `--flag=value`.
TEST(CliErrorsTest, EveryMisspelledFlagGetsItsFlagSuggested) {
  int checked = 0;
  for (const CommandInfo& c : AllCommands()) {
    std::set<std::string> own;
    for (const auto& names : c.flags) own.insert(names.begin(), names.end());
    for (const auto& names : c.flags) {
      const std::string& flag = names.front();
      const std::string typo = "--" + Swapped(flag.substr(2));
      if (typo == "--" || own.count(typo)) continue;  // no swap makes it another spelling
      const bool with_value = checked % 2 == 1;
      const std::string args = c.path + " " + typo + (with_value ? "=1" : "");
      CliRun r = Strata(args);
      SCOPED_TRACE("strata " + args + "\n" + r.out);
      EXPECT_EQ(r.rc, 2);
      const std::string head = Prefix(c.path) + ": unknown flag " + typo + " (did you mean ";
      EXPECT_EQ(r.out.rfind(head, 0), 0u);
      EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not exactly one line";
      const std::set<std::string> suggested = Suggested(r.out);
      EXPECT_TRUE(suggested.count(flag)) << "does not suggest " << flag;
      EXPECT_LE(suggested.size(), 3u);
      ++checked;
    }
  }
  EXPECT_GT(checked, STRATA_HAVE_TORCH ? 100 : 40);
}

// Every command and group subcommand, misspelled where it is typed.
TEST(CliErrorsTest, EveryMisspelledCommandGetsItsCommandSuggested) {
  int checked = 0;
  for (const CommandInfo& group : AllCommands()) {
    const std::set<std::string> own(group.subcommands.begin(), group.subcommands.end());
    for (const std::string& sub : group.subcommands) {
      const std::string typo = Swapped(sub);
      if (typo.empty() || own.count(typo)) continue;
      const std::string args = group.path + " " + typo;
      CliRun r = Strata(args);
      SCOPED_TRACE("strata " + args + "\n" + r.out);
      EXPECT_EQ(r.rc, 2);
      EXPECT_EQ(
          r.out.rfind(Prefix(group.path) + ": unknown command " + typo + " (did you mean ", 0), 0u);
      EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not exactly one line";
      EXPECT_TRUE(Suggested(r.out).count(sub)) << "does not suggest " << sub;
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

struct LineCase {
  std::string args;
  std::string line;  // the whole output; a prefix of it where it ends in "..."
};

// The lines themselves, as a user reads them.
TEST(CliErrorsTest, TheLinesSayWhatAndWhere) {
  char tmpl[] = "/tmp/strata-cli-errors-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<LineCase> cases = {
      {"trian", "strata: unknown command trian (did you mean train?)"},
      {"bench ioo", "strata bench: unknown command ioo (did you mean io?)"},
      {"deploy", "strata: unknown command deploy (see strata --help)"},
      {"bench", "strata bench: missing command: one of io, adam, tiers..."},
      {"", "strata: missing command: one of bench, tune-io, clean, estimate..."},
      {"bench io --pth x", "strata bench io: unknown flag --pth (did you mean --path?)"},
      {"bench io --pth=x", "strata bench io: unknown flag --pth (did you mean --path?)"},
      {"bench io --frobnicate",
       "strata bench io: unknown flag --frobnicate (see strata bench io --help)"},
      {"--log-levle debug report", "strata: unknown flag --log-levle (did you mean --log-level?)"},
      {"--verison", "strata: unknown flag --verison (did you mean --version?)"},
      {"report --log-level debug",
       "strata report: --log-level is a flag of strata: give it before report"},
      {"--log-level loud report", "strata: --log-level: loud not in {debug,info,warning,error}"},
      {"bench io --loops abc", "strata bench io: --loops: 'abc' is not a whole number"},
      {"bench io --loops 0", "strata bench io: --loops: 0 is not in range 1 to ..."},
      {"bench io --size 0", "strata bench io: --size: 0 is out of range: want ..."},
      {"bench io --size 2X", "strata bench io: --size: byte size '2X' has unknown unit..."},
      {"bench io --path " + dir + "/missing",
       "strata bench io: --path: " + dir + "/missing: no such directory"},
      {"bench io --loops", "strata bench io: --loops: missing its value"},
      {"clean", "strata clean: --path is required"},
      {"tokenize --model " + dir + " --input " + dir,
       "strata tokenize: --input: " + dir + " is a directory, expected a file"},
  };
#if STRATA_HAVE_TORCH
  cases.push_back(
      {"train --stpes 3", "strata train: unknown flag --stpes (did you mean --steps?)"});
  cases.push_back({"train --steps abc", "strata train: --steps: 'abc' is not a whole number"});
  cases.push_back({"train --steps 1.5", "strata train: --steps: '1.5' is not a whole number"});
  cases.push_back({"train --lr abc", "strata train: --lr: 'abc' is not a number"});
  cases.push_back({"train --steps", "strata train: --steps: missing its value"});
  cases.push_back({"train --model tiny --steps", "strata train: --steps: missing its value"});
  cases.push_back({"eval --data x", "strata eval: --model is required"});
#endif
  for (const LineCase& c : cases) {
    CliRun r = Strata(c.args);
    SCOPED_TRACE("strata " + c.args + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not exactly one line";
    if (c.line.size() > 3 && c.line.compare(c.line.size() - 3, 3, "...") == 0) {
      EXPECT_EQ(r.out.rfind(c.line.substr(0, c.line.size() - 3), 0), 0u);
    } else {
      EXPECT_EQ(r.out, c.line + "\n");
    }
  }
  std::filesystem::remove_all(dir);
}

// With --json a refused line still prints nothing on stdout: the line is on stderr.
TEST(CliErrorsTest, JsonStdoutStaysEmpty) {
  for (const std::string args : {"bench io --json --pth x", "bench io --json --loops abc",
                                 "estimate --json --modle tiny", "bench --json"}) {
    CliRun out = Shell(std::string(STRATA_BINARY) + " " + args + " 2>/dev/null");
    CliRun err = Shell(std::string(STRATA_BINARY) + " " + args + " >/dev/null");
    SCOPED_TRACE(args + "\n" + err.out);
    EXPECT_EQ(out.rc, 2);
    EXPECT_EQ(out.out, "");
    EXPECT_EQ(err.out.rfind("strata ", 0), 0u);
    EXPECT_EQ(err.out.find('\n'), err.out.size() - 1);
  }
}

}  // namespace
