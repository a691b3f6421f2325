// Every flag of every `strata` command, given a bad value through the binary: exit code 2, a
// message naming the flag, no signal, no hang, nothing started. The inventory test reads each
// command's --help, so a flag added without a case here (and so, likely, without a check) fails.
// Then the semantic checks behind the flags: values valid alone but not for this model, config or
// checkpoint.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Shell;

// Every command; "train", "eval" and "generate" only in builds with libtorch.
std::vector<std::string> Commands() {
  std::vector<std::string> c = {"estimate", "report",   "tokenize",   "tune-io",
                                "clean",    "bench io", "bench adam", "bench tiers"};
#if STRATA_HAVE_TORCH
  for (const char* t : {"train", "eval", "generate", "bench step", "bench comm"}) c.push_back(t);
#endif
  return c;
}

// A hang shows up as rc 124 from timeout(1) instead of a stuck test.
CliRun Strata(const std::string& args) {
  return Shell("timeout 120 " + std::string(STRATA_BINARY) + " " + args);
}

// The flags of `command` that take a value, read from its --help: "  --name TYPE..." where TYPE is
// CLI11's upper-case type name (TEXT, INT, UINT, FLOAT, or a validator's: SIZE, FILE, DIR...).
std::set<std::string> ValueFlags(const std::string& command) {
  CliRun help = Strata(command + " --help");
  EXPECT_EQ(help.rc, 0) << help.out;
  std::set<std::string> flags;
  const std::regex option(R"(^  (?:-\w,)?(--[a-z0-9-]+) ([A-Z][A-Z0-9_]*)\b)");
  std::istringstream lines(help.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, option) && m[2] != "Excludes" && m[2] != "Needs") {
      flags.insert(m[1]);
    }
  }
  return flags;
}

class FlagsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-flags-cli-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/data.txt") << "Pack my box with five dozen liquor jugs.\n";
    std::ofstream(dir_ + "/file") << "not a directory\n";
    std::filesystem::create_directory(dir_ + "/subdir");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The arguments `command` needs besides the flag under test (its required flags, valid).
  std::string Required(const std::string& command, const std::string& flag) const {
    std::string args;
    auto add = [&](const std::string& f, const std::string& v) {
      if (f != flag) args += " " + f + " " + v;
    };
    if (command == "eval") {
      add("--model", "tiny");
      add("--data", dir_ + "/data.txt");
      add("--seq-len", "8");
    } else if (command == "generate") {
      add("--model", "tiny");
      add("--prompt", "hi");
      add("--max-new-tokens", "1");
    } else if (command == "tokenize") {
      add("--model", dir_);
      add("--input", dir_ + "/data.txt");
      add("--output", dir_ + "/out.bin");
    }
    return args;
  }

  std::string dir_;
};

struct BadValue {
  std::string command;
  std::string flag;
  std::string value;
  std::string says;  // a part of the message
};

// Bad values by class. Paths are relative to the test's directory where they start with "@".
const std::vector<BadValue>& BadValues() {
  static const std::vector<BadValue> cases = {
      // Counts: negative, zero where a count must be positive, not a number, out of the type.
      {"estimate", "--nproc", "0", "not in range"},
      {"train", "--nproc", "0", "not in range"},
      {"train", "--nproc", "abc", "--nproc"},
      {"train", "--steps", "-1", "not in range"},
      {"train", "--steps", "1e99", "--steps"},
      {"train", "--steps", "abc", "--steps"},
      {"train", "--save-every", "-1", "neither a number of steps >= 1 nor \"epoch\""},
      {"train", "--save-every", "0", "neither a number of steps >= 1 nor \"epoch\""},
      {"train", "--save-every", "epochs", "--save-every"},
      {"train", "--eval-every", "abc", "neither a number of steps >= 1 nor \"epoch\""},
      {"train", "--eval-max-batches", "0", "not in range"},
      {"train", "--save-total-limit", "0", "not in range"},
      {"train", "--epochs", "0", "0 is outside (0, 1e+06]"},
      {"train", "--epochs", "nan", "nan is not a finite number"},
      {"train", "--epochs", "inf", "inf is not a finite number"},
      {"train", "--epochs", "abc", "'abc' is not a number"},
      {"train", "--eval-data", "@missing.bin", "no such file"},
      {"train", "--tensorboard", "@file", "expected a directory"},
      {"train", "--micro-batch", "2147483648", "not in range"},
      {"train", "--grad-accum", "0", "not in range"},
      {"train", "--warmup-steps", "-1", "--warmup-steps"},
      {"eval", "--max-batches", "-1", "not in range"},
      {"eval", "--micro-batch", "0", "not in range"},
      {"eval", "--grad-accum", "-2", "not in range"},
      {"eval", "--warmup-steps", "x", "--warmup-steps"},
      {"estimate", "--micro-batch", "0", "not in range"},
      {"estimate", "--grad-accum", "99999999999", "not in range"},
      {"estimate", "--warmup-steps", "-5", "--warmup-steps"},
      // Hugging Face's schedules: a known lr_scheduler_type, a ratio in [0, 1], a minimum >= 0.
      {"train", "--lr-scheduler", "cosin", "not in"},
      {"train", "--warmup-ratio", "1.5", "1.5 is outside [0, 1]"},
      {"train", "--max-grad-norm", "nan", "nan is not a finite number"},
      {"train", "--max-grad-norm", "-1", "outside [0, 1e+12]"},
      {"train", "--lr", "nan", "nan is not a finite number"},
      {"train", "--lr", "0", "0 is outside (0, 1e+38]"},
      {"train", "--min-lr", "-1e-5", "--min-lr"},
      {"train", "--min-lr", "1e308", "1e308 is outside [0, 1000]"},
      {"train", "--min-lr-rate", "x", "--min-lr-rate"},
      {"eval", "--lr-scheduler", "polynomial", "not in"},
      {"eval", "--warmup-ratio", "-0.1", "outside [0, 1]"},
      {"eval", "--min-lr", "x", "--min-lr"},
      {"eval", "--min-lr-rate", "-1", "--min-lr-rate"},
      {"estimate", "--lr-scheduler", "Cosine", "not in"},
      {"estimate", "--warmup-ratio", "abc", "--warmup-ratio"},
      {"estimate", "--min-lr", "-2", "--min-lr"},
      {"estimate", "--min-lr-rate", "-0.5", "--min-lr-rate"},
      {"bench step", "--device", "tpu", "is not a device: auto, host, cuda or cuda:N"},
      {"bench io", "--loops", "0", "not in range"},
      {"bench io", "--queue-depth", "0", "not in range"},
      {"bench tiers", "--queue-depth", "5000", "not in range"},
      {"bench tiers", "--prefetch", "-1", "--prefetch"},
      {"bench tiers", "--device", "tpu", "unknown device kind 'tpu'"},
      {"bench adam", "--iters", "0", "not in range"},
      {"bench step", "--layers", "0", "not in range"},
      {"bench step", "--width", "-4", "not in range"},
      {"bench step", "--heads", "0", "not in range"},
      {"bench step", "--batch", "0", "not in range"},
      {"bench step", "--host-memory", "8Q", "unknown unit"},
      {"bench step", "--steps", "-3", "not in range"},
      {"bench step", "--device-units", "-1", "not in range"},
      {"bench step", "--buffer-count", "1", "not in range"},
      {"bench step", "--model", "no-such-preset", "--model"},
      {"bench comm", "--nproc", "0", "not in range"},
      {"bench comm", "--min-bytes", "0", "out of range"},
      {"bench comm", "--max-bytes", "abc", "--max-bytes"},
      {"bench comm", "--iters", "0", "not in range"},
      {"bench comm", "--timeout", "-1", "not in range"},
      // Threads: negative, absurd (used to hang starting 100000 threads).
      {"train", "--threads", "-3", "not in range"},
      {"train", "--threads", "100000", "not in range"},
      {"eval", "--threads", "100000", "not in range"},
      {"bench adam", "--threads", "-1", "not in range"},
      {"bench step", "--threads", "100000", "not in range"},
      {"bench io", "--threads", "65", "not in range"},
      {"bench tiers", "--threads", "0", "not in range"},
      // Sequence lengths.
      {"train", "--seq-len", "0", "not in range"},
      {"train", "--seq-len", "99999999", "not in range"},
      {"eval", "--seq-len", "-1", "not in range"},
      {"estimate", "--seq-len", "0", "not in range"},
      {"bench step", "--seq", "0", "not in range"},
      // Seeds: decimal digits only ("-1" used to wrap around silently).
      {"train", "--seed", "-1", "not a non-negative 64-bit integer"},
      {"train", "--seed", "18446744073709551616", "not a non-negative 64-bit integer"},
      // Floats.
      {"train", "--lr", "-1", "--lr"},
      {"train", "--max-grad-norm", "-0.5", "--max-grad-norm"},
      {"eval", "--lr", "abc", "--lr"},
      {"eval", "--max-grad-norm", "x", "--max-grad-norm"},
      {"estimate", "--lr", "0", "--lr"},
      {"estimate", "--max-grad-norm", "-1", "--max-grad-norm"},
      // Byte sizes and counts with units.
      {"train", "--device", "gpu", "is not a device: auto, host, cuda or cuda:N"},
      {"eval", "--device", "cuda:one", "--device"},
      {"train", "--device-memory", "2X", "unknown unit"},
      {"train", "--device-memory", "-1G", "--device-memory"},
      {"eval", "--device-memory", "lots", "--device-memory"},
      {"train", "--host-memory", "2X", "unknown unit"},
      {"eval", "--host-memory", "-1G", "--host-memory"},
      {"estimate", "--host-memory", "lots", "--host-memory"},
      {"estimate", "--device-memory", "12Q", "unknown unit"},
      {"train", "--max-shard-size", "5XB", "unknown unit"},
      {"bench io", "--size", "0", "out of range"},
      {"bench io", "--block-size", "100", "out of range"},
      {"bench tiers", "--size", "abc", "--size"},
      {"bench tiers", "--block", "0", "out of range"},
      {"bench tiers", "--block-size", "2G", "out of range"},
      {"bench adam", "--numel", "0", "out of range"},
      {"bench step", "--sub-group", "many", "--sub-group"},
      {"tune-io", "--size", "-5", "--size"},
      {"estimate", "--params", "lots", "--params"},
      {"estimate", "--largest-layer", "-1", "--largest-layer"},
      // Choices.
      {"train", "--data-dtype", "int8", "not in"},
      {"eval", "--data-dtype", "float", "not in"},
      {"train", "--export-dtype", "int8", "not in"},
      {"estimate", "--dtype", "fp8", "not in"},
      {"estimate", "--mode", "infer", "not in"},
      {"bench io", "--backend", "spdk", "not in"},
      {"bench tiers", "--backend", "spdk", "not in"},
      {"bench step", "--backend", "spdk", "not in"},
      {"bench adam", "--optimizer", "sgd", "not in"},
      {"bench adam", "--grad-dtype", "fp8", "not in"},
      {"bench adam", "--copy-out", "fp32", "not in"},
      {"bench adam", "--moments", "fp16", "not in"},
      {"bench adam", "--isa", "neon", "not in"},
      // Files read: missing, a directory, a device.
      {"train", "--config", "@missing.json", "no such file"},
      {"train", "--config", "@subdir", "is a directory"},
      {"train", "--config", "/dev/zero", "is a character device"},
      {"train", "--data", "@subdir", "is a directory"},
      {"train", "--data", "@missing.bin", "no such file"},
      {"eval", "--data", "@subdir", "is a directory"},
      {"eval", "--config", "/dev/zero", "is a character device"},
      {"estimate", "--config", "@subdir", "is a directory"},
      {"tokenize", "--input", "@subdir", "is a directory"},
      // Directories read.
      {"train", "--resume", "@file", "expected a directory"},
      {"train", "--resume", "@missing", "no such directory"},
      {"eval", "--resume", "@file", "expected a directory"},
      {"tokenize", "--model", "@file", "expected a directory"},
      {"report", "--path", "@file", "expected a directory"},
      {"bench io", "--path", "@missing", "no such directory"},
      {"bench tiers", "--path", "@file", "expected a directory"},
      {"bench step", "--path", "@file", "expected a directory"},
      {"tune-io", "--path", "@file", "expected a directory"},
      {"clean", "--path", "@file", "is not a directory"},
      {"clean", "--path", "@missing", "does not exist"},
      // Model specs (checked by the command: a preset name or a directory).
      {"train", "--model", "@missing", "--model"},
      {"eval", "--model", "no-such-preset", "--model"},
      {"estimate", "--model", "@file", "--model"},
      // Files written: a directory, or in a directory that does not exist.
      {"train", "--log-json", "@subdir", "is a directory"},
      {"train", "--trace", "@missing/trace.json", "does not exist"},
      {"tokenize", "--output", "@subdir", "is a directory"},
      {"bench step", "--trace", "@subdir", "is a directory"},
      // Directories written: an existing file, or under one.
      {"train", "--save", "@file", "expected a directory"},
      {"train", "--save", "@file/ckpt", "is a regular file"},
      {"train", "--export", "@file", "expected a directory"},
      // Specs and lists.
      {"train", "--trace-steps", "abc", "want N or A-B"},
      {"train", "--trace-steps", "3-1", "want N or A-B"},
      {"train", "--trace-steps", "0", "want N or A-B"},
      {"tune-io", "--block-sizes", "1M,,2M", "empty element"},
      {"tune-io", "--queue-depths", "8,0", "not in range"},
      {"tune-io", "--threads", "1,x", "--threads"},
      {"tune-io", "--backends", "uring,spdk", "not in"},
      // generate: its own checks (before any model is loaded) and the shared ones.
      {"generate", "--model", "no-such-preset", "--model"},
      {"generate", "--prompt", "", "--prompt"},
      {"generate", "--prompt-ids", "@missing.txt", "no such file"},
      {"generate", "--max-new-tokens", "0", "not in range"},
      {"generate", "--temperature", "-1", "-1 is outside [0, 10000]"},
      {"generate", "--temperature", "nan", "nan is not a finite number"},
      {"generate", "--temperature", "1e-300", "at least 1e-06"},
      {"generate", "--top-p", "1.5", "1.5 is outside (0, 1]"},
      {"generate", "--top-p", "0", "0 is outside (0, 1]"},
      {"generate", "--seed", "-1", "not a non-negative 64-bit integer"},
      {"generate", "--config", "@subdir", "is a directory"},
      {"generate", "--device", "gpu", "is not a device: auto, host, cuda or cuda:N"},
      {"generate", "--device-memory", "lots", "--device-memory"},
      {"generate", "--host-memory", "2X", "unknown unit"},
      {"generate", "--threads", "100000", "not in range"},
      // The global flag.
      {"report", "--log-level", "loud", "not in"},
  };
  return cases;
}

std::string Resolve(const std::string& value, const std::string& dir) {
  return !value.empty() && value[0] == '@' ? dir + "/" + value.substr(1) : value;
}

TEST_F(FlagsCliTest, EveryFlagThatTakesAValueHasABadValueCase) {
  std::map<std::string, std::set<std::string>> covered;
  for (const BadValue& b : BadValues()) covered[b.command].insert(b.flag);
  int checked = 0;
  for (const std::string& command : Commands()) {
    for (const std::string& flag : ValueFlags(command)) {
      if (command == "report" && flag == "--log-level") continue;  // the global flag, below
      EXPECT_TRUE(covered[command].count(flag) ||
                  (covered["report"].count(flag) && flag == "--log-level"))
          << "strata " << command << " " << flag << " has no bad-value case here";
      ++checked;
    }
  }
  EXPECT_GT(checked, STRATA_HAVE_TORCH ? 60 : 40);  // the inventory really read the help texts
}

TEST_F(FlagsCliTest, BadValuesAreRefusedNamingTheFlag) {
  const std::vector<std::string> all = Commands();
  const std::set<std::string> commands(all.begin(), all.end());
  for (const BadValue& b : BadValues()) {
    if (!commands.count(b.command)) continue;
    const std::string value = Resolve(b.value, dir_);
    const std::string args = (b.flag == "--log-level" ? b.flag + " '" + value + "' " + b.command
                                                      : b.command + " " + b.flag + " '" + value +
                                                            "'" + Required(b.command, b.flag));
    CliRun r = Strata(args);
    SCOPED_TRACE("strata " + args + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    EXPECT_EQ(r.signal, 0);
    EXPECT_NE(r.out.find(b.flag), std::string::npos) << "the message does not name the flag";
    EXPECT_NE(r.out.find(b.says), std::string::npos) << "missing: " << b.says;
    for (const char* bad : {"terminate called", "Aborted", "core dumped", "internal"}) {
      EXPECT_EQ(r.out.find(bad), std::string::npos) << bad;
    }
  }
}

#if STRATA_HAVE_TORCH
// The validators refuse only what is wrong: limits and the "0 means default" values pass.
TEST_F(FlagsCliTest, ValuesAtTheLimitsAreAccepted) {
  CliRun r =
      Strata("train --model tiny --steps 2 --quiet --data " + dir_ +
             "/data.txt --threads 0 --seed 18446744073709551615 --device-memory 0 --host-memory 0 "
             "--trace-steps 1-2 --trace " +
             dir_ + "/t.json --log-json " + dir_ + "/l.jsonl --save " + dir_ +
             "/new/nested/ckpt --save-every 1 --seq-len 8");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/t.json"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/new/nested/ckpt/latest"));
}

// A sequence length the flag allows but whose activations cannot fit this machine (a 4 TiB
// allocation used to be attempted), and the same through a huge micro-batch.
TEST_F(FlagsCliTest, ABatchLargerThanMemoryIsRefusedBeforeAllocating) {
  for (const std::string& flags :
       {std::string("--seq-len 1000000"), std::string("--seq-len 64 --micro-batch 100000000")}) {
    CliRun r =
        Strata("train --model small --steps 1 --quiet --data " + dir_ + "/data.txt " + flags);
    SCOPED_TRACE(flags + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.out.find("of activations per micro-batch"), std::string::npos);
    EXPECT_NE(r.out.find("more than this machine's"), std::string::npos);
  }
}

// Batch keys beyond what the engine counts are refused, not narrowed to 32 bits (2^31
// accumulation steps used to train zero micro-batches and print loss -0.0).
TEST_F(FlagsCliTest, HugeBatchKeysInTheConfigAreRefused) {
  const std::string cfg = dir_ + "/big.json";
  for (const std::string& keys :
       {std::string(
            R"("train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2147483648)"),
        std::string(R"("train_micro_batch_size_per_gpu": 4294967296)"),
        std::string(R"("train_batch_size": 9e18, "train_micro_batch_size_per_gpu": 1)")}) {
    std::ofstream(cfg) << "{" << keys
                       << R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
    CliRun r =
        Strata("train --model tiny --steps 1 --quiet --data " + dir_ + "/data.txt --config " + cfg);
    SCOPED_TRACE(keys + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.out.find("expected an integer"), std::string::npos);
    EXPECT_EQ(r.out.find("done after"), std::string::npos);
  }
}

// A checkpoint's trainer.json edited to a step its engine state did not reach is refused; a
// checkpoint already at --steps says there is nothing to train instead of "finishing".
TEST_F(FlagsCliTest, ResumeStepsAreChecked) {
  const std::string data = " --seq-len 8 --data " + dir_ + "/data.txt";
  const std::string common = "train --model tiny --quiet" + data + " --save " + dir_ + "/ck";
  ASSERT_EQ(Strata(common + " --steps 2").rc, 0);
  CliRun done = Strata("train --model tiny --quiet" + data + " --resume " + dir_ + "/ck --steps 2");
  EXPECT_EQ(done.rc, 2) << done.out;
  EXPECT_NE(done.out.find("nothing to train"), std::string::npos) << done.out;

  std::string tag;
  std::ifstream(dir_ + "/ck/latest") >> tag;
  const std::string tj = dir_ + "/ck/" + tag + "/trainer.json";
  std::stringstream text;
  text << std::ifstream(tj).rdbuf();
  const std::string original = text.str();
  const std::string mpath = dir_ + "/ck/" + tag + "/MANIFEST.json";
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(mpath));
  struct Edit {
    std::string step;  // what "step" becomes
    std::string says;
  } edits[] = {
      {"1000000000000",
       "trainer.json: step 1000000000000 does not match the engine state's 2 steps"},
      {"1e300", "trainer.json: step: expected an integer"},  // a float is refused, never cast
  };
  for (const Edit& edit : edits) {
    SCOPED_TRACE(edit.step);
    std::string edited =
        std::regex_replace(original, std::regex(R"("step":\s*2)"), "\"step\": " + edit.step);
    ASSERT_NE(edited, original);
    std::ofstream(tj) << edited;
    // As a person who knows the format would: the manifest's size and checksum updated too, so
    // that the step check itself (not the checksum) is what refuses it.
    nlohmann::json m = manifest;
    bool found = false;
    for (auto& e : m["entries"]) {
      if (e["name"] != "trainer.json") continue;
      // The digest covers the entry's name and a NUL byte first ("checksum": "xxh64-named").
      const std::string named = std::string("trainer.json") + '\0' + edited;
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx",
                    static_cast<unsigned long long>(XXH64(named.data(), named.size(), 0)));
      e["size"] = edited.size();
      e["xxh64"] = hex;
      found = true;
    }
    ASSERT_TRUE(found) << m.dump();
    std::ofstream(mpath) << m.dump(1);
    CliRun r = Strata("train --model tiny --quiet" + data + " --resume " + dir_ + "/ck --steps 3");
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(r.signal, 0) << r.out;
    EXPECT_NE(r.out.find(edit.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
  }
}
#endif

}  // namespace
