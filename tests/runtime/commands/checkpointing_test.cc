// Checkpoints of a training run (runtime/commands/checkpointing.h) over a tiny engine: what a save
// writes, what resuming restores and refuses, which checkpoints pruning keeps, and the two-phase
// commit over Gloo with two ranks in forked processes (a save that commits, its resume on both
// ranks, and a rank that cannot write its part leaving no checkpoint behind).
#include "runtime/commands/checkpointing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/launcher.h"
#include "runtime/engine/engine.h"
#include "runtime/persist/checkpoint_store.h"
#include "tests/runtime/comm/rank_fork.h"
#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using engine_testing::TinyNet;

// The engine of one rank over a tiny model, trained `steps` steps on fixed data.
struct RankEngine {
  TinyNet net{nullptr};
  std::unique_ptr<Engine> engine;
};

Result<RankEngine> Trained(uint64_t seed, const std::string& swap_dir,
                           std::shared_ptr<Communicator> comm,
                           std::shared_ptr<Communicator> grad_comm, int steps) {
  torch::manual_seed(seed);
  RankEngine r;
  r.net = TinyNet(2, 8);
  EngineOptions o = engine_testing::Options(Home::kCpu, Home::kCpu, swap_dir);
  o.communicator = std::move(comm);
  o.grad_communicator = std::move(grad_comm);
  STRATA_ASSIGN_OR_RETURN(r.engine, Engine::Create(r.net.ptr(), std::move(o)));
  torch::manual_seed(99);
  const torch::Tensor x = torch::randn({4, 4});
  const torch::Tensor y = torch::randn({4, 1});
  for (int s = 0; s < steps; ++s) {
    STRATA_RETURN_IF_ERROR(r.engine->Backward(r.net->Loss(x, y)));
    STRATA_RETURN_IF_ERROR(r.engine->Step());
  }
  return r;
}

CheckpointRun RunOf(Engine& engine, Communicator& comm) {
  CheckpointRun c;
  c.engine = &engine;
  c.comm = &comm;
  c.model = {{"name", "tiny-net"}};
  c.seq_len = 8;
  c.seed = 7;
  c.micro_batch = 2;
  c.gradient_accumulation_steps = 1;
  c.run_id = "run-a";
  c.config_text = R"({"train_micro_batch_size_per_gpu": 2 /* as given */})";
  return c;
}

// Every parameter's value, in VisitParameters' order (a collective with ranks).
Result<std::vector<float>> Values(Engine& engine) {
  std::vector<float> out;
  STRATA_RETURN_IF_ERROR(engine.VisitParameters(
      [&](const std::string&, const std::vector<int64_t>& shape, const float* values) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        out.insert(out.end(), values, values + n);
        return Status::Ok();
      }));
  return out;
}

class CheckpointingTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  testing::TempDir dir_{"strata-checkpointing-test"};
};

TEST_F(CheckpointingTest, SaveWritesTrainerStateAndResumeRestoresIt) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  Result<RankEngine> a = Trained(1, dir_.File("swap-a"), nullptr, nullptr, 2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string root = dir_.File("save");
  const Status saved = SaveCheckpoint(RunOf(*a->engine, *comm), root, {2, 8});
  ASSERT_TRUE(saved.ok()) << saved.ToString();

  Result<CheckpointReader> reader = OpenCheckpoint(root);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->tag(), "step-2");
  Result<nlohmann::json> t = reader->ReadJson("trainer.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)["step"], 2);
  EXPECT_EQ((*t)["samples"], 8);
  EXPECT_EQ((*t)["seed"], 7);
  EXPECT_EQ((*t)["model"], nlohmann::json({{"name", "tiny-net"}}));
  EXPECT_EQ((*t)["seq_len"], 8);
  EXPECT_EQ((*t)["world_size"], 1);
  EXPECT_EQ((*t)["run"], "run-a");
  EXPECT_EQ((*t)["global_batch"], 2);
  Result<nlohmann::json> config = reader->ReadJson("config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ((*config)["train_micro_batch_size_per_gpu"], 2);

  // A fresh engine (other initial values) resumes to the saved position and values.
  Result<RankEngine> b = Trained(2, dir_.File("swap-b"), nullptr, nullptr, 0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Result<TrainingPosition> at = ResumeCheckpoint(RunOf(*b->engine, *comm), *reader, root);
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->step, 2);
  EXPECT_EQ(at->samples, 8u);
  EXPECT_EQ(b->engine->global_steps(), 2);
  Result<std::vector<float>> va = Values(*a->engine), vb = Values(*b->engine);
  ASSERT_TRUE(va.ok() && vb.ok());
  EXPECT_EQ(*va, *vb);
}

TEST_F(CheckpointingTest, ResumeRefusesAnotherSeqLenAndAnotherModel) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  Result<RankEngine> a = Trained(1, dir_.File("swap-a"), nullptr, nullptr, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string root = dir_.File("save");
  ASSERT_TRUE(SaveCheckpoint(RunOf(*a->engine, *comm), root, {1, 2}).ok());
  Result<CheckpointReader> reader = OpenCheckpoint(root);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();

  Result<RankEngine> b = Trained(2, dir_.File("swap-b"), nullptr, nullptr, 0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  CheckpointRun longer = RunOf(*b->engine, *comm);
  longer.seq_len = 16;
  Result<TrainingPosition> at = ResumeCheckpoint(longer, *reader, "CKPT");
  EXPECT_EQ(at.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(at.status().message().find("--seq-len 16 differs from the 8 tokens checkpoint CKPT"),
            std::string::npos)
      << at.status().ToString();

  CheckpointRun other = RunOf(*b->engine, *comm);
  other.model = {{"name", "another"}};
  at = ResumeCheckpoint(other, *reader, "CKPT");
  EXPECT_EQ(at.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(at.status().message().find("the checkpoint's files do not belong together"),
            std::string::npos)
      << at.status().ToString();
}

TEST_F(CheckpointingTest, PruneKeepsTheTwoNewestOfTheRunOnly) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  Result<RankEngine> a = Trained(1, dir_.File("swap-a"), nullptr, nullptr, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string root = dir_.File("save");
  CheckpointRun other = RunOf(*a->engine, *comm);
  other.run_id = "run-b";
  ASSERT_TRUE(SaveCheckpoint(other, root, {1, 2}).ok());  // step-1 of another lineage
  for (int64_t step : {2, 3, 4}) {
    ASSERT_TRUE(SaveCheckpoint(RunOf(*a->engine, *comm), root, {step, 2}).ok());
  }
  const Status pruned = PruneRunCheckpoints(root, "run-a");
  ASSERT_TRUE(pruned.ok()) << pruned.ToString();
  namespace fs = std::filesystem;
  EXPECT_TRUE(fs::exists(root + "/step-1"));
  EXPECT_FALSE(fs::exists(root + "/step-2"));
  EXPECT_TRUE(fs::exists(root + "/step-3"));
  EXPECT_TRUE(fs::exists(root + "/step-4"));
}

// ---- Two ranks over Gloo (forked processes; each child prints what failed and returns 1) ------

DistEnv Env(int rank, int port) {
  DistEnv e;
  e.rank = rank;
  e.world_size = 2;
  e.local_rank = rank;
  e.local_world_size = 2;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

// Rank `rank` of 2: trains a step, saves it into `root`, then resumes it into a fresh engine.
int SaveAndResume(int rank, int port, const std::string& dir) {
  torch::set_num_threads(1);
  auto comms = ConnectGloo(Env(rank, port), 2, std::chrono::seconds(20));
  RANK_OK(comms.status());
  Communicator& comm = *(*comms)[0];
  const std::string swap = dir + "/swap-" + std::to_string(rank);
  Result<RankEngine> a = Trained(1, swap + "a", (*comms)[0], (*comms)[1], 1);
  RANK_OK(a.status());
  const std::string root = dir + "/save";
  RANK_OK(SaveCheckpoint(RunOf(*a->engine, comm), root, {1, 4}));
  Result<CheckpointReader> reader = OpenCheckpoint(root);
  RANK_OK(reader.status());
  RANK_CHECK(reader->tag() == "step-1");
  Result<nlohmann::json> t = reader->ReadJson("trainer.json");
  RANK_OK(t.status());
  RANK_CHECK((*t)["world_size"] == 2 && (*t)["global_batch"] == 4 && (*t)["samples"] == 4);

  Result<RankEngine> b = Trained(2, swap + "b", (*comms)[0], (*comms)[1], 0);
  RANK_OK(b.status());
  Result<TrainingPosition> at = ResumeCheckpoint(RunOf(*b->engine, comm), *reader, root);
  RANK_OK(at.status());
  RANK_CHECK(at->step == 1 && at->samples == 4 && b->engine->global_steps() == 1);
  Result<std::vector<float>> va = Values(*a->engine);
  RANK_OK(va.status());
  Result<std::vector<float>> vb = Values(*b->engine);
  RANK_OK(vb.status());
  RANK_CHECK(*va == *vb);
  return 0;
}

// Runs `ranks_fn(rank, port, dir)` on two forked ranks over Gloo; both must return 0.
void ExpectTwoRanksPass(int (*ranks_fn)(int rank, int port, const std::string& dir)) {
  testing::TempDir dir("strata-checkpointing-gloo");
  ASSERT_TRUE(dir.ok());
  Result<int> port = FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  const std::vector<int> codes = strata::testing::RunRanks(
      2, [&](int rank) { return ranks_fn(rank, *port, dir.path()); }, std::chrono::seconds(120));
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(CheckpointingGlooTest, TwoRanksCommitOneCheckpointAndResumeIt) {
#ifndef STRATA_TEST_HAVE_GLOO
  GTEST_SKIP() << "built without the Gloo communicator";
#endif
  ExpectTwoRanksPass(&SaveAndResume);
}

// Rank 1 is given another root, so it cannot join rank 0's temporary directory: it returns its
// error, rank 0 kUnavailable naming rank 1, and no checkpoint appears (rank 0 removes its
// directory).
int SaveWithAFailingRank(int rank, int port, const std::string& dir) {
  torch::set_num_threads(1);
  auto comms = ConnectGloo(Env(rank, port), 2, std::chrono::seconds(20));
  RANK_OK(comms.status());
  Communicator& comm = *(*comms)[0];
  Result<RankEngine> a =
      Trained(1, dir + "/swap-" + std::to_string(rank), (*comms)[0], (*comms)[1], 1);
  RANK_OK(a.status());
  const std::string root = dir + (rank == 0 ? "/save" : "/elsewhere");
  const Status saved = SaveCheckpoint(RunOf(*a->engine, comm), root, {1, 4});
  if (rank == 0) {  // told by rank 1
    RANK_CHECK(saved.code() == StatusCode::kUnavailable);
    RANK_CHECK(saved.message().find("checkpoint step-1: rank 1 could not write its part") !=
               std::string::npos);
  } else {  // its own error
    RANK_CHECK(saved.code() == StatusCode::kFailedPrecondition);
    RANK_CHECK(saved.message().find("need --save on a shared filesystem") != std::string::npos);
  }
  if (rank == 0) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
      RANK_CHECK(e.path().filename().string().find("step-1") == std::string::npos);
    }
    RANK_CHECK(!std::filesystem::exists(root + "/latest"));
  }
  return 0;
}

TEST(CheckpointingGlooTest, ARankThatCannotWriteItsPartLeavesNoCheckpoint) {
#ifndef STRATA_TEST_HAVE_GLOO
  GTEST_SKIP() << "built without the Gloo communicator";
#endif
  ExpectTwoRanksPass(&SaveWithAFailingRank);
}

}  // namespace
}  // namespace strata::runtime
