// The command framework (runtime/commands/command.h) with stand-in commands: exit codes, the one
// error line, --json printing exactly one JSON object, flag errors, exceptions, and Ctrl-C.
#include "runtime/commands/command.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/commands/flag_checks.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

// Runs `body` as its Run; prints "text: <answer>" as its human form.
class FakeCommand final : public Command {
 public:
  explicit FakeCommand(std::function<Status(CommandContext&, json&)> body, bool has_json = true)
      : Command("fake", "A stand-in"), body_(std::move(body)), has_json_(has_json) {}
  bool has_json() const override { return has_json_; }
  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--answer", answer_, "The answer");
    cmd.add_option("--ratio", ratio_, "A fraction");
    cmd.add_option("--size", size_, "A byte size")->check(flags::ByteSize(1, 1 << 20));
    cmd.add_option("--threads", threads_, "Threads")->check(flags::Threads());
  }
  Status Run(CommandContext& ctx, json& result) override {
    result["answer"] = answer_;
    return body_(ctx, result);
  }
  void PrintText(const json& result, std::FILE* out) const override {
    std::fprintf(out, "text: %d\n", result["answer"].get<int>());
  }

 private:
  std::function<Status(CommandContext&, json&)> body_;
  bool has_json_;
  int answer_ = 42;
  double ratio_ = 0.5;
  std::string size_;
  int64_t threads_ = 1;
};

struct Outcome {
  int exit_code = -1;
  std::string out, err;
};

// Registers one FakeCommand at the top level and one under the group "bench", then runs `args`.
int RunArgs(std::vector<std::string> args, std::function<Status(CommandContext&, json&)> body,
            bool has_json = true) {
  CommandLine cli("test", "test 1.0");
  cli.AddGroup("bench", "Benchmarks");
  cli.Add(std::make_unique<FakeCommand>(body, has_json));
  cli.Add(std::make_unique<FakeCommand>(body, has_json), "bench");
  args.insert(args.begin(), "strata");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return cli.Run(static_cast<int>(argv.size()), argv.data());
}

// RunArgs with stdout and stderr captured.
Outcome RunCli(
    std::vector<std::string> args,
    std::function<Status(CommandContext&, json&)> body = [](CommandContext&,
                                                            json&) { return Status::Ok(); },
    bool has_json = true) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  Outcome o;
  o.exit_code = RunArgs(std::move(args), std::move(body), has_json);
  o.out = testing::internal::GetCapturedStdout();
  o.err = testing::internal::GetCapturedStderr();
  return o;
}

std::function<Status(CommandContext&, json&)> Returning(Status status) {
  return [status](CommandContext&, json&) { return status; };
}

TEST(ExitCodeTest, MapsEveryCode) {
  EXPECT_EQ(ExitCode(Status::Ok()), 0);
  EXPECT_EQ(ExitCode(InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCode(NotFoundError("x")), 2);
  EXPECT_EQ(ExitCode(CancelledError("x")), 130);
  EXPECT_EQ(ExitCode(IoErrorFromErrno(5, "x")), 1);
  EXPECT_EQ(ExitCode(UnavailableError("x")), 1);
  EXPECT_EQ(ExitCode(ResourceExhaustedError("x")), 1);
  EXPECT_EQ(ExitCode(DataLossError("x")), 1);
  EXPECT_EQ(ExitCode(InternalError("x")), 1);
}

TEST(CommandLineTest, TextByDefault) {
  const Outcome o = RunCli({"fake", "--answer", "7"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.out, "text: 7\n");
  EXPECT_EQ(o.err, "");
}

TEST(CommandLineTest, JsonIsExactlyOneObject) {
  const Outcome o = RunCli({"bench", "fake", "--json"});
  EXPECT_EQ(o.exit_code, 0);
  const json j = json::parse(o.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << o.out;  // the whole output parses: nothing before or after
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("answer").get<int>(), 42);
  EXPECT_EQ(o.out.find("text:"), std::string::npos);
}

TEST(CommandLineTest, NoJsonFlagWhenTheCommandHasNoJsonForm) {
  EXPECT_EQ(RunCli({"fake", "--json"}, Returning(Status::Ok()), /*has_json=*/false).exit_code, 2);
}

TEST(CommandLineTest, FailurePrintsOneLineNamingTheCommand) {
  const Outcome o = RunCli({"bench", "fake", "--json"}, Returning(IoErrorFromErrno(5, "read x")));
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.out, "");  // no result, not even with --json
  EXPECT_EQ(o.err, "strata bench fake: io_error: read x: Input/output error (errno 5)\n");
}

TEST(CommandLineTest, BadInputIs2) {
  EXPECT_EQ(RunCli({"fake"}, Returning(InvalidArgumentError("--answer"))).exit_code, 2);
  EXPECT_EQ(RunCli({"fake"}, Returning(NotFoundError("no such file"))).exit_code, 2);
  EXPECT_EQ(RunCli({"fake", "--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(RunCli({"fake", "--answer", "forty-two"}).exit_code, 2);
  EXPECT_EQ(RunCli({"no-such-command"}).exit_code, 2);
  EXPECT_EQ(RunCli({"bench"}).exit_code, 2);  // a group needs one of its commands
  EXPECT_EQ(RunCli({}).exit_code, 2);
  EXPECT_EQ(RunCli({"--log-level", "loud", "fake"}).exit_code, 2);
}

TEST(CommandLineTest, HelpAndVersionAreSuccess) {
  const Outcome help = RunCli({"fake", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--answer"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--json"), std::string::npos) << help.out;
  const Outcome version = RunCli({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("test 1.0"), std::string::npos);
}

TEST(CommandLineTest, CancelledIs130AndSilent) {
  const Outcome o = RunCli({"fake"}, Returning(CancelledError("interrupted")));
  EXPECT_EQ(o.exit_code, 130);
  EXPECT_EQ(o.err, "");
}

TEST(CommandLineTest, AnEscapingExceptionIsAnInternalError) {
  const Outcome o =
      RunCli({"fake"}, [](CommandContext&, json&) -> Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.err, "strata fake: internal: uncaught exception: boom\n");
}

TEST(CommandLineTest, FirstInterruptSetsTheStopFlag) {
  const Outcome o = RunCli({"fake"}, [](CommandContext& ctx, json&) -> Status {
    EXPECT_FALSE(ctx.json());
    ctx.CatchInterrupts();
    EXPECT_FALSE(ctx.stop_requested());
    raise(SIGINT);  // handled: the process goes on
    EXPECT_TRUE(ctx.stop_requested());
    EXPECT_TRUE(ctx.stop_flag()->load());
    return CancelledError("interrupted");
  });
  EXPECT_EQ(o.exit_code, 130);
  // After the command its interrupt scope is closed: a signal is fatal again, as before it
  // (base/signals.h), and the next command starts clean.
  EXPECT_EXIT(raise(SIGINT), ::testing::KilledBySignal(SIGINT), "");
  RunCli({"fake"}, [](CommandContext& ctx, json&) {
    ctx.CatchInterrupts();
    EXPECT_FALSE(ctx.stop_requested());
    return Status::Ok();
  });
}

TEST(CommandLineDeathTest, SecondInterruptEndsTheProcess) {
  EXPECT_EXIT(RunArgs({"fake"},
                      [](CommandContext& ctx, json&) {
                        ctx.CatchInterrupts();
                        raise(SIGTERM);
                        raise(SIGTERM);  // the previous (default) action: terminate
                        return Status::Ok();
                      }),
              testing::KilledBySignal(SIGTERM), "");
}

// A refused command line: one line on stderr naming the command and the mistake, exit code 2,
// nothing on stdout (also with --json), and the command never runs.
struct LineCase {
  std::vector<std::string> args;
  std::string err;
};

TEST(CommandLineTest, WholeNumbersAreReadAsCli11ReadsThem) {
  EXPECT_EQ(RunCli({"fake", "--answer", "0x10"}).out, "text: 16\n");
  EXPECT_EQ(RunCli({"fake", "--answer", "-3"}).out, "text: -3\n");
}

TEST(CommandLineTest, RefusedLinesSayWhatAndWhereInOneLine) {
  const std::vector<LineCase> cases = {
      {{"fake", "--answre", "7"}, "strata fake: unknown flag --answre (did you mean --answer?)\n"},
      {{"fake", "--answre=7"}, "strata fake: unknown flag --answre (did you mean --answer?)\n"},
      {{"bench", "fake", "--json", "--rtaio", "1"},
       "strata bench fake: unknown flag --rtaio (did you mean --ratio?)\n"},
      {{"fake", "--zzzzzz"}, "strata fake: unknown flag --zzzzzz (see strata fake --help)\n"},
      {{"fake", "-q"}, "strata fake: unknown flag -q (see strata fake --help)\n"},
      {{"--log-levle", "info", "fake"},
       "strata: unknown flag --log-levle (did you mean --log-level?)\n"},
      {{"--verison"}, "strata: unknown flag --verison (did you mean --version?)\n"},
      {{"fake", "--log-level", "info"},
       "strata fake: --log-level is a flag of strata: give it before fake\n"},
      {{"fkae"}, "strata: unknown command fkae (did you mean fake?)\n"},
      {{"bnech", "fake"}, "strata: unknown command bnech (did you mean bench?)\n"},
      {{"bench", "fkae"}, "strata bench: unknown command fkae (did you mean fake?)\n"},
      {{"deploy"}, "strata: unknown command deploy (see strata --help)\n"},
      {{"fake", "extra"},
       "strata fake: unexpected argument 'extra' (flags start with --; see strata fake --help)\n"},
      {{"bench"}, "strata bench: missing command: one of fake (see strata bench --help)\n"},
      {{}, "strata: missing command: one of bench or fake (see strata --help)\n"},
      {{"fake", "--answer", "forty-two"},
       "strata fake: --answer: 'forty-two' is not a whole number\n"},
      {{"fake", "--answer=1.5"}, "strata fake: --answer: '1.5' is not a whole number\n"},
      {{"fake", "--answer", "99999999999"},
       "strata fake: --answer: '99999999999' is out of range\n"},
      {{"fake", "--answer", "0x1G"}, "strata fake: --answer: '0x1G' is not a whole number\n"},
      {{"fake", "--threads", "99999999999999999999"},
       "strata fake: --threads: 99999999999999999999 is not in range 1 to 1024\n"},
      {{"fake", "--ratio", "half"}, "strata fake: --ratio: 'half' is not a number\n"},
      {{"fake", "--threads", "x"}, "strata fake: --threads: 'x' is not a whole number\n"},
      {{"fake", "--threads", "0"}, "strata fake: --threads: 0 is not in range 1 to 1024\n"},
      {{"fake", "--size", "2X"}, "strata fake: --size: "},  // the byte-size parser's own words
      {{"fake", "--size", "2G"}, "strata fake: --size: 2G is out of range: want "},
      {{"fake", "--answer"}, "strata fake: --answer: missing its value\n"},
      {{"--log-level", "loud", "fake"},
       "strata: --log-level: loud not in {debug,info,warning,error}\n"},
  };
  for (const LineCase& c : cases) {
    std::string line;
    for (const std::string& a : c.args) line += a + " ";
    SCOPED_TRACE(line);
    bool ran = false;
    const Outcome o = RunCli(c.args, [&ran](CommandContext&, json&) {
      ran = true;
      return Status::Ok();
    });
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(o.out, "");
    EXPECT_FALSE(ran);
    if (c.err.back() == '\n') {
      EXPECT_EQ(o.err, c.err);
    } else {
      EXPECT_EQ(o.err.rfind(c.err, 0), 0u) << o.err;
      EXPECT_EQ(o.err.find('\n'), o.err.size() - 1) << "not one line: " << o.err;
    }
  }
}

}  // namespace
}  // namespace strata::runtime
