// Command-line mistakes (runtime/commands/command.h): one line on stderr, "strata <command>: ...",
// naming the mistake and the closest flag or command, exit code 2, nothing on stdout.
//
// Every command and group subcommand, and every long flag of each, is covered, also those added
// later: the inventory is read from the binary's own --help texts, and the same commands are
// built in this process (as tools/strata/main.cc registers them) and must have the same
// inventory. Each long flag is then misspelled (two inner letters swapped) in-process, where a
// refused line costs microseconds, and one per command through the binary, where it costs a
// process start of a few seconds; the misspelled commands and the messages for bad values go
// through the binary.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/commands.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
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

// Each command's path ("" for strata itself, "bench io") and the long names of its options.
using Inventory = std::map<std::string, std::set<std::string>>;

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + " " + name;
}

// strata itself, every command and group, and every group's commands, from their --help; read
// once (a process start each).
const Inventory& BinaryInventory() {
  static const Inventory inventory = [] {
    Inventory all;
    std::vector<std::string> todo = {""};
    while (!todo.empty()) {
      const std::string path = todo.back();
      todo.pop_back();
      const std::string help = Help(path);
      std::set<std::string>& flags = all[path];
      for (const auto& names : LongFlags(help)) flags.insert(names.begin(), names.end());
      for (const std::string& sub : Subcommands(help)) todo.push_back(Join(path, sub));
    }
    return all;
  }();
  return inventory;
}

// A CommandLine with the commands tools/strata/main.cc registers (InventoriesAgree keeps the two
// lists the same).
std::unique_ptr<strata::runtime::CommandLine> StrataCommandLine() {
  using namespace strata;
  auto cli = std::make_unique<runtime::CommandLine>("strata", "strata test");
  cli->AddGroup("bench", "Measure one part of the machine or of strata");
  cli->Add(bench::NewBenchIoCommand(), "bench");
  cli->Add(bench::NewBenchAdamCommand(), "bench");
  cli->Add(bench::NewBenchTiersCommand(), "bench");
#if STRATA_HAVE_TORCH
  cli->Add(bench::NewBenchStepCommand(), "bench");
  cli->Add(bench::NewBenchCommCommand(), "bench");
#endif
  cli->Add(bench::NewTuneIoCommand());
  cli->Add(runtime::NewCleanCommand());
  cli->Add(runtime::NewEstimateCommand());
  cli->Add(runtime::NewPlotCommand());
  cli->Add(runtime::NewReportCommand());
  cli->Add(runtime::NewTokenizeCommand());
#if STRATA_HAVE_TORCH
  cli->Add(runtime::NewTrainCommand());
  cli->Add(runtime::NewEvalCommand());
  cli->Add(runtime::NewGenerateCommand());
#endif
  return cli;
}

void Walk(CLI::App* app, const std::string& path, Inventory& out) {
  std::set<std::string>& flags = out[path];
  for (const CLI::Option* opt : app->get_options()) {
    for (const std::string& l : opt->get_lnames()) flags.insert("--" + l);
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App* s) { return !s->get_name().empty(); })) {
    Walk(sub, Join(path, sub->get_name()), out);
  }
}

Inventory InProcessInventory() {
  Inventory all;
  Walk(&StrataCommandLine()->app(), "", all);
  return all;
}

// The subcommands of `path` in an inventory.
std::vector<std::string> SubcommandsOf(const Inventory& inventory, const std::string& path) {
  std::vector<std::string> subs;
  for (const auto& [p, flags] : inventory) {
    const std::string head = path.empty() ? "" : path + " ";
    if (p.empty() || p.rfind(head, 0) != 0) continue;
    const std::string rest = p.substr(head.size());
    if (!rest.empty() && rest.find(' ') == std::string::npos) subs.push_back(rest);
  }
  return subs;
}

struct InProcessRun {
  int rc = -1;
  std::string out, err;
};

InProcessRun RunInProcess(const std::string& line) {
  std::vector<std::string> args = {"strata"};
  std::istringstream words(line);
  for (std::string w; words >> w;) args.push_back(w);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  auto cli = StrataCommandLine();
  InProcessRun r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  r.rc = cli->Run(static_cast<int>(argv.size()), argv.data());
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
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

// The misspelling of a flag or command used below: "" where none is made (no two letters differ,
// or the swap spells another flag or command of the same command).
std::string Typo(const std::string& word, const std::set<std::string>& taken) {
  const bool dashes = word.rfind("--", 0) == 0;
  const std::string swapped = Swapped(dashes ? word.substr(2) : word);
  if (swapped.empty()) return "";
  const std::string typo = dashes ? "--" + swapped : swapped;
  return taken.count(typo) ? "" : typo;
}

// Checks that `line` is the one line refusing `typo` in `where`, suggesting `meant`.
void ExpectSuggestion(const std::string& line, const std::string& where, const std::string& what,
                      const std::string& typo, const std::string& meant) {
  EXPECT_EQ(line.rfind(where + ": unknown " + what + " " + typo + " (did you mean ", 0), 0u);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "not exactly one line";
  const std::set<std::string> suggested = Suggested(line);
  EXPECT_TRUE(suggested.count(meant)) << "does not suggest " << meant;
  EXPECT_LE(suggested.size(), 3u);
}

TEST(CliErrorsTest, InventoriesAgree) {
  const Inventory& binary = BinaryInventory();
  for (const char* known : {"", "bench", "bench io", "bench adam", "bench tiers", "estimate",
                            "report", "tokenize", "tune-io", "clean"}) {
    EXPECT_TRUE(binary.count(known)) << "no `strata " << known << "` in the help texts";
  }
#if STRATA_HAVE_TORCH
  for (const char* known : {"train", "eval", "generate", "bench step", "bench comm"}) {
    EXPECT_TRUE(binary.count(known)) << "no `strata " << known << "` in the help texts";
  }
  ASSERT_TRUE(binary.count("train"));
  EXPECT_TRUE(binary.at("train").count("--steps"));
#endif
  size_t flags = 0;
  for (const auto& [path, names] : binary) flags += names.size();
  EXPECT_GT(flags, STRATA_HAVE_TORCH ? 120u : 50u);  // the help texts were really read
  // A command added to tools/strata/main.cc must be added to StrataCommandLine() above too.
  EXPECT_EQ(InProcessInventory(), binary);
}

// Every long flag of every command, misspelled (alone and as --flag=value): exit code 2, nothing on
// stdout, exactly one line naming the command and suggesting that flag.
TEST(CliErrorsTest, EveryMisspelledFlagGetsItsFlagSuggested) {
  int checked = 0;
  for (const auto& [path, flags] : InProcessInventory()) {
    for (const std::string& flag : flags) {
      const std::string typo = Typo(flag, flags);
      if (typo.empty()) continue;
      for (const std::string& form : {typo, typo + "=1"}) {
        const std::string line = path + " " + form;
        const InProcessRun r = RunInProcess(line);
        SCOPED_TRACE("strata " + line + "\n" + r.err);
        EXPECT_EQ(r.rc, 2);
        EXPECT_EQ(r.out, "");
        ExpectSuggestion(r.err, Prefix(path), "flag", typo, flag);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, STRATA_HAVE_TORCH ? 100 : 40);
}

// The same through the binary, one flag per command (a different one for each). The commands are
// the in-process ones, which InventoriesAgree holds equal to the binary's (without starting the
// binary for each --help again).
TEST(CliErrorsTest, AMisspelledFlagOfEachCommandThroughTheBinary) {
  size_t i = 0;
  for (const auto& [path, flags] : InProcessInventory()) {
    std::vector<std::string> list(flags.begin(), flags.end());
    std::string flag, typo;
    for (size_t k = 0; k < list.size() && typo.empty(); ++k) {
      flag = list[(i + k) % list.size()];
      typo = Typo(flag, flags);
    }
    ++i;
    ASSERT_FALSE(typo.empty()) << path;
    CliRun r = Strata(path + " " + typo);
    SCOPED_TRACE("strata " + path + " " + typo + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    ExpectSuggestion(r.out, Prefix(path), "flag", typo, flag);
  }
}

// Every command and group subcommand, misspelled where it is typed, through the binary.
TEST(CliErrorsTest, EveryMisspelledCommandGetsItsCommandSuggested) {
  const Inventory inventory = InProcessInventory();
  int checked = 0;
  for (const auto& [path, flags] : inventory) {
    const std::vector<std::string> subs = SubcommandsOf(inventory, path);
    const std::set<std::string> taken(subs.begin(), subs.end());
    for (const std::string& sub : subs) {
      const std::string typo = Typo(sub, taken);
      if (typo.empty()) continue;
      CliRun r = Strata(path + " " + typo);
      SCOPED_TRACE("strata " + path + " " + typo + "\n" + r.out);
      EXPECT_EQ(r.rc, 2);
      ExpectSuggestion(r.out, Prefix(path), "command", typo, sub);
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
      {"estmate", "strata: unknown command estmate (did you mean estimate?)"},
      {"bench ioo", "strata bench: unknown command ioo (did you mean io?)"},
      {"deploy", "strata: unknown command deploy (see strata --help)"},
      {"bench", "strata bench: missing command: one of io, adam..."},
      {"", "strata: missing command: one of bench, tune-io, clean, estimate..."},
      {"bench io --pth x", "strata bench io: unknown flag --pth (did you mean --path?)"},
      {"bench io --frobnicate",
       "strata bench io: unknown flag --frobnicate (see strata bench io --help)"},
      {"--log-levle debug report", "strata: unknown flag --log-levle (did you mean --log-level?)"},
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
  cases.push_back({"trian", "strata: unknown command trian (did you mean train?)"});
  cases.push_back(
      {"train --stpes 3", "strata train: unknown flag --stpes (did you mean --steps?)"});
  cases.push_back({"train --steps abc", "strata train: --steps: 'abc' is not a whole number"});
  cases.push_back({"train --lr abc", "strata train: --lr: 'abc' is not a number"});
  // A value of 60000 digits (std::regex's recursion overflowed the stack on it).
  cases.push_back({"train --steps " + std::string(60000, '1'), "strata train: --steps: 111..."});
  cases.push_back({"train --model tiny --steps", "strata train: --steps: missing its value"});
  cases.push_back({"eval", "strata eval: --model is required"});
  cases.push_back({"generate", "strata generate: --model is required"});
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
  for (const std::string args : {"estimate --json --modle tiny", "bench io --json --loops abc"}) {
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
