// `strata train` end to end, through the binary: resume in a new process is exact, and bad data or
// a corrupt checkpoint are refused with clear errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <algorithm>

namespace {

struct CliRun {
  int rc = -1;
  std::string out;
};

CliRun Strata(const std::string& args) {
  const std::string cmd = std::string(STRATA_BINARY) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) r.out += buf;
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

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
    for (int i = 0; i < 400; ++i) data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
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
  const std::string script =
      "sh -c '" + std::string(STRATA_BINARY) + " " + Common() + " --steps 1000000 --save " + dir_ +
      "/int --log-json " + log + " > " + dir_ + "/int.out 2>&1 & pid=$!; i=0; "
      "while [ ! -s " + log + " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
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
