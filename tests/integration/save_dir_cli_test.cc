// `strata train --save` directories through the binary: no run destroys another's work.
//   - a fresh run refuses a --save directory holding another run's checkpoints (they stay intact,
//     `latest` and model.safetensors too); --resume into it, or --overwrite-save, is accepted, and
//     pruning then removes only the run's own checkpoints;
//   - a second live run on the same --save directory is refused at start; once the first dies
//     (kill -9) the directory is usable again;
//   - --resume DIR/step-N resumes that checkpoint, not `latest`;
//   - resuming with another --seq-len is refused naming both lengths;
//   - a checkpoint whose state files were swapped (manifest recomputed over the bytes) or whose
//     trainer.json disagrees with the engine state is refused;
//   - a token file truncated under a live run ends it with exit 1 naming the file (no SIGBUS),
//   after
//     saving.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::CliRun;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Shell;
using strata::testing::TempDir;

namespace fs = std::filesystem;

const std::string kStrata = STRATA_BINARY;

// The checkpoint tags in `dir` (directories with a MANIFEST.json).
std::set<std::string> Tags(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (fs::exists(e.path() / "MANIFEST.json")) out.insert(e.path().filename().string());
  }
  return out;
}

std::string Latest(const std::string& dir) {
  std::string s = ReadFileOrEmpty(dir + "/latest");
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class SaveDirCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    std::ofstream cfg(dir_ + "/ds.json");
    cfg << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}}})";
  }
  std::string Train(const std::string& args) const {
    return kStrata + " train --model tiny --config " + dir_ + "/ds.json --data " + dir_ +
           "/data.txt --threads 1 --quiet " + args;
  }

  TempDir tmp_{"strata-save-dir"};
  std::string dir_;
};

TEST_F(SaveDirCliTest, AnotherRunsCheckpointsAreNeverOverwrittenOrPruned) {
  const std::string d = dir_ + "/D";
  CliRun a = Shell(Train("--steps 6 --save-every 2 --save " + d));
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(Tags(d), (std::set<std::string>{"step-4", "step-6"}));
  const std::string a_model = ReadFileOrEmpty(d + "/model.safetensors");
  const std::string a_step6 = ReadFileOrEmpty(d + "/step-6/MANIFEST.json");
  ASSERT_FALSE(a_model.empty());

  // A fresh run (same model, then another one) is refused, touching nothing.
  for (const std::string model : {"tiny", "small"}) {
    CliRun b = Shell(kStrata + " train --model " + model + " --data " + dir_ +
                     "/data.txt --threads 1 --quiet --steps 2 --save " + d);
    EXPECT_EQ(b.rc, 2) << b.out;
    EXPECT_NE(b.out.find("another run"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("step-6"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("--overwrite-save"), std::string::npos) << b.out;
    EXPECT_EQ(b.out.find("step 1 "), std::string::npos) << "trained before refusing: " << b.out;
  }
  EXPECT_EQ(Tags(d), (std::set<std::string>{"step-4", "step-6"}));
  EXPECT_EQ(Latest(d), "step-6");
  EXPECT_TRUE(ReadFileOrEmpty(d + "/model.safetensors") == a_model);

  // Resuming the run into its own directory continues it; its pruning removes its own step-4.
  CliRun resumed = Shell(Train("--steps 8 --resume " + d + " --save " + d));
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_EQ(Tags(d), (std::set<std::string>{"step-6", "step-8"}));

  // --overwrite-save: a new run saves beside them and prunes only its own checkpoints.
  CliRun c = Shell(Train("--steps 3 --save-every 1 --overwrite-save --save " + d));
  ASSERT_EQ(c.rc, 0) << c.out;
  EXPECT_EQ(Tags(d), (std::set<std::string>{"step-2", "step-3", "step-6", "step-8"}));
  EXPECT_EQ(Latest(d), "step-3");
  EXPECT_TRUE(ReadFileOrEmpty(d + "/step-6/MANIFEST.json") == a_step6);

  // Continuing that run in D reaches steps the first run saved: its checkpoints are saved under
  // their own tags, the first run's step-6 and step-8 stay as they were.
  const std::string a_step8 = ReadFileOrEmpty(d + "/step-8/MANIFEST.json");
  CliRun c2 = Shell(Train("--steps 8 --save-every 3 --resume " + d + " --save " + d));
  ASSERT_EQ(c2.rc, 0) << c2.out;
  EXPECT_TRUE(ReadFileOrEmpty(d + "/step-6/MANIFEST.json") == a_step6);
  EXPECT_TRUE(ReadFileOrEmpty(d + "/step-8/MANIFEST.json") == a_step8);
  const std::set<std::string> tags = Tags(d);
  EXPECT_EQ(tags.size(), 4u) << ::testing::PrintToString(tags);  // A's two, C's newest two
  EXPECT_EQ(Latest(d).rfind("step-8-", 0), 0u) << Latest(d);
  EXPECT_EQ(tags.count(Latest(d)), 1u);

  // --resume DIR/step-N resumes that checkpoint (not `latest`, which is the other run's).
  CliRun old = Shell(Train("--steps 9 --resume " + d + "/step-8 --save " + dir_ + "/E"));
  ASSERT_EQ(old.rc, 0) << old.out;
  EXPECT_NE(old.out.find("at step 8"), std::string::npos) << old.out;
}

TEST_F(SaveDirCliTest, ASecondLiveRunOnTheSameDirectoryIsRefused) {
  const std::string d = dir_ + "/D";
  const std::string log = dir_ + "/first.jsonl";
  // The first run: long, saving every step; the second starts once it has trained a step.
  const std::string script =
      Train("--steps 100000 --save-every 1 --save " + d + " --log-json " + log) +
      " >/dev/null 2>&1 & pid=$!; for i in $(seq 1 600); do [ -s " + log +
      " ] && break; sleep 0.1; done; " + Train("--steps 2 --save " + d) +
      "; echo \"second rc=$?\"; kill -9 $pid; wait $pid 2>/dev/null; true";
  CliRun r = Shell(script);
  EXPECT_NE(r.out.find("second rc=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in use by another strata run"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pid"), std::string::npos) << r.out;
  // The first run's checkpoints are its own and intact; after its death the lock is gone.
  ASSERT_FALSE(Tags(d).empty());
  const std::string latest = Latest(d);
  ASSERT_EQ(latest.rfind("step-", 0), 0u) << latest;
  const int step = std::stoi(latest.substr(5));
  CliRun next =
      Shell(Train("--steps " + std::to_string(step + 1) + " --resume " + d + " --save " + d));
  EXPECT_EQ(next.rc, 0) << next.out;
  EXPECT_EQ(next.out.find("in use"), std::string::npos) << next.out;
}

TEST_F(SaveDirCliTest, ResumingWithAnotherSequenceLengthIsRefused) {
  const std::string d = dir_ + "/D";
  CliRun a = Shell(Train("--steps 2 --seq-len 32 --save " + d));
  ASSERT_EQ(a.rc, 0) << a.out;
  CliRun r = Shell(Train("--steps 3 --seq-len 16 --resume " + d));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--seq-len 16 differs from the 32 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
  CliRun same = Shell(Train("--steps 3 --seq-len 32 --resume " + d));
  EXPECT_EQ(same.rc, 0) << same.out;
}

// Rewrites `ck`'s manifest entry `name` to the size and xxh64 of its current bytes, keeping every
// other key: over the bytes alone (`named` false, as a tool that knows only the bytes would) or
// over the name, a NUL byte and the bytes (`named`, as "xxh64-named" says).
void RecomputeManifestEntry(const std::string& ck, const std::string& name, bool named) {
  const std::string mpath = ck + "/MANIFEST.json";
  nlohmann::json m = nlohmann::json::parse(ReadFileOrEmpty(mpath));
  const std::string bytes = ReadFileOrEmpty(ck + "/" + name);
  const std::string hashed = named ? name + '\0' + bytes : bytes;
  for (auto& e : m["entries"]) {
    if (e["name"] != name) continue;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(XXH64(hashed.data(), hashed.size(), 0)));
    e["size"] = bytes.size();
    e["xxh64"] = hex;
  }
  std::ofstream(mpath) << m.dump(1);
}

TEST_F(SaveDirCliTest, SwappedOrMismatchedCheckpointFilesAreRefused) {
  const std::string d = dir_ + "/D";
  CliRun a = Shell(Train("--steps 2 --save " + d));
  ASSERT_EQ(a.rc, 0) << a.out;
  const std::string ck = d + "/step-2";
  // Two state files of the same size, swapped, the manifest recomputed over their bytes.
  std::vector<std::string> blocks;
  for (const auto& e : fs::recursive_directory_iterator(ck)) {
    const std::string rel = fs::relative(e.path(), ck).string();
    if (e.is_regular_file() && rel.rfind("params/blocks.", 0) == 0) blocks.push_back(rel);
  }
  std::sort(blocks.begin(), blocks.end());
  ASSERT_GE(blocks.size(), 2u);
  ASSERT_EQ(fs::file_size(ck + "/" + blocks[0]), fs::file_size(ck + "/" + blocks[1]));
  const std::string copy = dir_ + "/copy";
  fs::copy(d, copy, fs::copy_options::recursive);
  const std::string cck = copy + "/step-2";
  fs::rename(cck + "/" + blocks[0], cck + "/swap.tmp");
  fs::rename(cck + "/" + blocks[1], cck + "/" + blocks[0]);
  fs::rename(cck + "/swap.tmp", cck + "/" + blocks[1]);
  RecomputeManifestEntry(cck, blocks[0], /*named=*/false);
  RecomputeManifestEntry(cck, blocks[1], /*named=*/false);
  CliRun swapped = Shell(Train("--steps 3 --resume " + copy));
  EXPECT_EQ(swapped.rc, 1) << swapped.out;
  EXPECT_NE(swapped.out.find("checksum mismatch"), std::string::npos) << swapped.out;
  EXPECT_EQ(swapped.out.find("done after"), std::string::npos) << swapped.out;

  // trainer.json naming another model or world size than the engine state: refused, even with a
  // manifest that matches (digest over the entry's name, a NUL byte and the bytes).
  struct Edit {
    const char* key;
    nlohmann::json value;
    const char* says;
  } edits[] = {{"model", {{"name", "small"}}, "do not belong together"},
               {"world_size", 4, "do not belong together"}};
  for (const Edit& edit : edits) {
    SCOPED_TRACE(edit.key);
    const std::string other = dir_ + "/edit-" + edit.key;
    fs::copy(d, other, fs::copy_options::recursive);
    const std::string tj = other + "/step-2/trainer.json";
    nlohmann::json t = nlohmann::json::parse(ReadFileOrEmpty(tj));
    t[edit.key] = edit.value;
    const std::string text = t.dump();
    std::ofstream(tj) << text;
    RecomputeManifestEntry(other + "/step-2", "trainer.json", /*named=*/true);
    CliRun r = Shell(Train("--steps 3 --resume " + other));
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(edit.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
  }
}

// A checkpoint keeps the config it was trained with: resuming without --config trains on with it
// (bitwise as the straight run), instead of the demo's config and a layout mismatch.
TEST_F(SaveDirCliTest, ResumingWithoutConfigUsesTheCheckpointsConfig) {
  CliRun straight = Shell(Train("--steps 4 --save " + dir_ + "/A"));
  ASSERT_EQ(straight.rc, 0) << straight.out;
  CliRun first = Shell(Train("--steps 2 --save " + dir_ + "/B"));
  ASSERT_EQ(first.rc, 0) << first.out;
  CliRun resumed = Shell(kStrata + " train --model tiny --data " + dir_ +
                         "/data.txt --threads 1 --quiet --steps 4 --resume " + dir_ + "/B --save " +
                         dir_ + "/C");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("was trained with (give --config to use another)"), std::string::npos)
      << resumed.out;
  const std::string a = ReadFileOrEmpty(dir_ + "/A/model.safetensors");
  ASSERT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == ReadFileOrEmpty(dir_ + "/C/model.safetensors"));
}

std::vector<double> Losses(const std::string& log) {
  std::vector<double> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return out;
}

// Saved with micro-batch 8 x accumulation 1, resumed with 4 x 2 (the same global batch): the
// resumed steps are those of a run that used 4 x 2 throughout (up to the rounding of summing the
// batch in two halves), not shifted by an accumulation window counted from the saved run's.
TEST_F(SaveDirCliTest, ResumingWithAnotherSplitOfTheGlobalBatchContinuesTheRun) {
  std::ofstream(dir_ + "/auto.json")
      << R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
      << dir_ << R"(/nvme"}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" << dir_
      << R"(/nvme"}}})";
  const std::string common = kStrata + " train --model tiny --config " + dir_ +
                             "/auto.json --data " + dir_ + "/data.txt --threads 1 --quiet ";
  CliRun straight = Shell(common + "--steps 6 --micro-batch 4 --grad-accum 2 --log-json " + dir_ +
                          "/straight.jsonl");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  CliRun first = Shell(common + "--steps 3 --micro-batch 8 --grad-accum 1 --save " + dir_ + "/ck");
  ASSERT_EQ(first.rc, 0) << first.out;
  CliRun resumed = Shell(common + "--steps 6 --micro-batch 4 --grad-accum 2 --resume " + dir_ +
                         "/ck --log-json " + dir_ + "/resumed.jsonl");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_EQ(resumed.out.find("global batch"), std::string::npos) << resumed.out;  // the same
  const std::vector<double> want = Losses(dir_ + "/straight.jsonl");
  const std::vector<double> got = Losses(dir_ + "/resumed.jsonl");
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[3 + i], 1e-4 * std::fabs(want[3 + i])) << "step " << 4 + i;
  }
  // Another global batch is said, naming both.
  CliRun other =
      Shell(common + "--steps 4 --micro-batch 2 --grad-accum 1 --resume " + dir_ + "/ck");
  EXPECT_EQ(other.rc, 0) << other.out;
  EXPECT_NE(other.out.find("global batch of 2"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("with 8"), std::string::npos) << other.out;
}

// A token file written wider than the width it would be read in (uint32 or int64 ids for a
// vocabulary that fits 16 bits) is refused naming the flag, instead of training on half-zero ids.
TEST_F(SaveDirCliTest, TokenFilesOfAnotherWidthAreRefusedNamingTheFlag) {
  std::vector<uint32_t> ids32(20000);
  std::vector<int64_t> ids64(20000);
  for (size_t i = 0; i < ids32.size(); ++i) ids32[i] = ids64[i] = (i * 7919) % 256;
  std::ofstream(dir_ + "/u32.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids32.data()),
             static_cast<std::streamsize>(ids32.size() * 4));
  std::ofstream(dir_ + "/i64.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids64.data()),
             static_cast<std::streamsize>(ids64.size() * 8));
  const std::string train = kStrata +
                            " train --model llama-tiny --seq-len 32 --threads 1 --quiet "
                            "--steps 1 --data ";
  CliRun u32 = Shell(train + dir_ + "/u32.bin");
  EXPECT_EQ(u32.rc, 2) << u32.out;
  EXPECT_NE(u32.out.find("u32.bin"), std::string::npos) << u32.out;
  EXPECT_NE(u32.out.find("pass --data-dtype uint32"), std::string::npos) << u32.out;
  CliRun i64 = Shell(train + dir_ + "/i64.bin");
  EXPECT_EQ(i64.rc, 2) << i64.out;
  EXPECT_NE(i64.out.find("64-bit ids"), std::string::npos) << i64.out;
  CliRun right = Shell(train + dir_ + "/u32.bin --data-dtype uint32");
  EXPECT_EQ(right.rc, 0) << right.out;
  EXPECT_NE(right.out.find("20000 tokens"), std::string::npos) << right.out;
}

TEST_F(SaveDirCliTest, ATokenFileTruncatedUnderARunEndsItNamingTheFile) {
  // llama-tiny (vocab 256) reads a uint16 .bin through the token-file path.
  const std::string data = dir_ + "/tok.bin";
  {
    std::vector<uint16_t> ids(200000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7919) % 256);
    std::ofstream(data, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()),
               static_cast<std::streamsize>(ids.size() * 2));
  }
  for (const std::string& shrink : {"truncate -s 0 " + data, "truncate -s 4000 " + data}) {
    SCOPED_TRACE(shrink);
    const std::string d = dir_ + "/D" + std::to_string(shrink.size());
    const std::string log = d + ".jsonl";
    {
      std::vector<uint16_t> ids(200000);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7919) % 256);
      std::ofstream(data, std::ios::binary)
          .write(reinterpret_cast<const char*>(ids.data()),
                 static_cast<std::streamsize>(ids.size() * 2));
    }
    const std::string script = kStrata + " train --model llama-tiny --seq-len 32 --data " + data +
                               " --threads 1 --quiet --steps 100000 --save " + d + " --log-json " +
                               log + " & pid=$!; for i in $(seq 1 600); do [ -s " + log +
                               " ] && break; sleep 0.1; done; " + shrink +
                               "; wait $pid; echo \"rc=$?\"";
    CliRun r = Shell(script);
    EXPECT_NE(r.out.find("rc=1"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("Bus error"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tok.bin changed while training read it"), std::string::npos) << r.out;
    // It saved the last complete step first, and that checkpoint resumes.
    EXPECT_FALSE(Tags(d).empty()) << r.out;
  }
}

}  // namespace
}  // namespace strata
