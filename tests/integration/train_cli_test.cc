// `strata train` end to end, through the binary: resume in a new process is exact, bad data or a
// corrupt checkpoint are refused with clear errors, and NVMe errors injected with STRATA_IO_FAULTS
// (swap/fault_spec.h) end the run with one clean line, exit code 1 and no swap files left behind.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct CliRun {
  int rc = -1;
  std::string out;
};

// Runs a shell command line, stdout and stderr together.
CliRun Shell(const std::string& line) {
  const std::string cmd = "(" + line + ") 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) r.out += buf;
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliRun Strata(const std::string& args) { return Shell(std::string(STRATA_BINARY) + " " + args); }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TrainCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-train-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    std::ofstream cfg(dir_ + "/ds.json");
    cfg << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}}})";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Common() const {
    return "train --model tiny --config " + dir_ + "/ds.json --data " + dir_ +
           "/data.txt --threads 1 --quiet";
  }
  std::string dir_;
};

TEST_F(TrainCliTest, ResumeInANewProcessIsExact) {
  CliRun straight = Strata(Common() + " --steps 6 --save " + dir_ + "/a");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  CliRun first = Strata(Common() + " --steps 3 --save " + dir_ + "/b");
  ASSERT_EQ(first.rc, 0) << first.out;
  CliRun resumed = Strata(Common() + " --steps 6 --resume " + dir_ + "/b --save " + dir_ + "/c");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::string a = ReadAll(dir_ + "/a/model.safetensors");
  const std::string c = ReadAll(dir_ + "/c/model.safetensors");
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == c) << "the resumed run's weights differ from the straight run's";
  // And they did change over the last 3 steps (the comparison is not vacuous).
  EXPECT_FALSE(a == ReadAll(dir_ + "/b/model.safetensors"));

  // The export, read here without strata's reader: u64 LE header length, JSON header, F32 tensors
  // named as the model names them, back to back to the end of the file.
  ASSERT_GE(a.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(a[i]);
  ASSERT_LE(8 + n, a.size());
  auto header = nlohmann::json::parse(a.substr(8, n));
  uint64_t expected_begin = 0, params = 0;
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t.at("dtype"), "F32") << name;
    uint64_t numel = 1;
    for (auto d : t.at("shape")) numel *= d.get<uint64_t>();
    const uint64_t b = t.at("data_offsets")[0], e = t.at("data_offsets")[1];
    EXPECT_EQ(e - b, numel * 4) << name;
    by_offset.emplace_back(b, name);
    params += numel;
  }
  std::sort(by_offset.begin(), by_offset.end());
  for (const auto& [b, name] : by_offset) {
    EXPECT_EQ(b, expected_begin) << name;
    expected_begin = b + header[name].at("data_offsets")[1].get<uint64_t>() - b;
  }
  EXPECT_EQ(8 + n + expected_begin, a.size());
  EXPECT_TRUE(header.contains("tok_emb.weight"));
  EXPECT_TRUE(header.contains("blocks.0.qkv.weight"));
  EXPECT_TRUE(header.contains("blocks.1.fc2.bias"));
  EXPECT_TRUE(header.contains("head.weight"));
  EXPECT_EQ(header["blocks.0.qkv.weight"]["shape"], nlohmann::json::array({192, 64}));
  EXPECT_GT(params, 100000u);
}

TEST_F(TrainCliTest, CorruptCheckpointIsRefused) {
  ASSERT_EQ(Strata(Common() + " --steps 2 --save " + dir_ + "/b").rc, 0);
  std::string victim;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_ + "/b")) {
    if (e.path().string().find("/params/") != std::string::npos) victim = e.path();
  }
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x5a');
  }
  CliRun r = Strata(Common() + " --steps 4 --resume " + dir_ + "/b");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
}

// Ctrl-C (SIGINT) once training runs: the step finishes, a checkpoint is saved, exit status 130.
TEST_F(TrainCliTest, InterruptSavesAndExits130) {
  const std::string log = dir_ + "/steps.jsonl";
  const std::string script = "sh -c '" + std::string(STRATA_BINARY) + " " + Common() +
                             " --steps 1000000 --save " + dir_ + "/int --log-json " + log + " > " +
                             dir_ +
                             "/int.out 2>&1 & pid=$!; i=0; "
                             "while [ ! -s " +
                             log +
                             " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
                             "kill -INT $pid; wait $pid; echo rc=$?'";
  FILE* p = popen(script.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[256];
  std::string out;
  while (fgets(buf, sizeof(buf), p)) out += buf;
  pclose(p);
  EXPECT_NE(out.find("rc=130"), std::string::npos) << out << ReadAll(dir_ + "/int.out");
  EXPECT_NE(ReadAll(dir_ + "/int.out").find("stopped (interrupted)"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/int/latest"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/int/model.safetensors"));
}

// Runs `strata <args>` with STRATA_IO_FAULTS=`faults` through a shell that prints the process id
// first (exec keeps it), so the test can name the demo's scratch directory /tmp/strata-demo-PID.
struct FaultRun {
  CliRun run;
  std::string pid;
  std::vector<std::string> error_lines;  // "strata train: ..." lines
};
FaultRun StrataWithFaults(const std::string& faults, const std::string& args) {
  FaultRun f;
  f.run = Shell("sh -c 'echo pid=$$; STRATA_IO_FAULTS=" + faults + " exec " +
                std::string(STRATA_BINARY) + " " + args + "'");
  std::istringstream lines(f.run.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("pid=", 0) == 0) f.pid = line.substr(4);
    if (line.rfind("strata train:", 0) == 0) f.error_lines.push_back(line);
  }
  return f;
}

// What every injected failure must look like: exit code 1 (not a signal, which the shell would
// report as 128 + N), one error line naming the file and offset, no abort.
void ExpectCleanFailure(const FaultRun& f, const std::string& what) {
  EXPECT_EQ(f.run.rc, 1) << f.run.out;
  ASSERT_EQ(f.error_lines.size(), 1u) << f.run.out;
  const std::string& line = f.error_lines[0];
  EXPECT_EQ(line.rfind("strata train: io_error: ", 0), 0u) << line;
  EXPECT_NE(line.find("[injected]"), std::string::npos) << line;
  EXPECT_NE(line.find(".swp offset "), std::string::npos) << line;
  EXPECT_NE(line.find("Input/output error (errno 5)"), std::string::npos) << line;
  EXPECT_NE(line.find(what), std::string::npos) << line;
  for (const char* bad : {"terminate called", "Aborted", "core dumped", "internal:"}) {
    EXPECT_EQ(f.run.out.find(bad), std::string::npos) << bad << " in:\n" << f.run.out;
  }
}

// An EIO on the first NVMe read, which is a parameter gather inside the first forward: with two
// pinned slots for the small preset's four units and small sub-groups, parameters do not stay in
// pinned memory. The run directory under the config's nvme_path is removed.
TEST_F(TrainCliTest, InjectedReadErrorInForwardIsACleanFailure) {
  std::ofstream(dir_ + "/small.json")
      << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "sub_group_size": 20000,
        "offload_param": {"device": "nvme", "nvme_path": ")"
      << dir_ << R"(/nvme", "buffer_count": 2},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
      << dir_ << R"(/nvme"}}})";
  const FaultRun f = StrataWithFaults("eio:read:1", "train --model small --config " + dir_ +
                                                        "/small.json --data " + dir_ +
                                                        "/data.txt --threads 1 --quiet --steps 2");
  ExpectCleanFailure(f, "gathering blocks.0: fetching block param/blocks.0 from NVMe: read ");
  ASSERT_TRUE(std::filesystem::is_directory(dir_ + "/nvme"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/nvme")) << "swap files left behind";
}

// EIO on a write-back during the first step, with the demo config (NVMe under
// /tmp/strata-demo-PID, which must be gone afterwards). With the tiny preset, writes 1-5 set the
// state up; write 6 is a gradient hand-off in backward, write 9 an optimizer sub-group's state.
TEST_F(TrainCliTest, InjectedWriteErrorsAreCleanFailures) {
  const std::string args = "train --model tiny --data " + dir_ + "/data.txt --threads 1 --quiet " +
                           "--steps 3 --log-json " + dir_ + "/steps.jsonl";
  const std::pair<const char*, const char*> cases[] = {
      {"eio:write:6", "writing back block grad/"}, {"eio:write:9", "writing back block state/"}};
  for (const auto& [faults, what] : cases) {
    SCOPED_TRACE(faults);
    const FaultRun f = StrataWithFaults(faults, args);
    ExpectCleanFailure(f, what);
    ASSERT_FALSE(f.pid.empty()) << f.run.out;
    EXPECT_FALSE(std::filesystem::exists("/tmp/strata-demo-" + f.pid)) << "scratch dir left";
    EXPECT_EQ(ReadAll(dir_ + "/steps.jsonl"), "");  // it failed inside the first step
  }
}

TEST_F(TrainCliTest, BadDataIsRefusedWithReason) {
  CliRun missing = Strata("train --model tiny --data " + dir_ + "/nope.txt --steps 1 --quiet");
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.out.find("nope.txt"), std::string::npos) << missing.out;
  std::ofstream(dir_ + "/short.txt") << "too short";
  CliRun short_text = Strata("train --model tiny --data " + dir_ + "/short.txt --steps 1 --quiet");
  EXPECT_EQ(short_text.rc, 2);
  EXPECT_NE(short_text.out.find("shorter than one sequence"), std::string::npos) << short_text.out;
}

}  // namespace
