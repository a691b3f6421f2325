// Engine state on disk (runtime/engine/engine_state.cc), through the Engine: ParameterValues in
// the model's order, the safetensors export holding exactly those values, and the checks
// SaveState and LoadState make. (Bitwise resumption is engine_exactness_test.cc's
// SaveLoadResumesExactly.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/persist/safetensors.h"
#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using engine_testing::TinyNet;

class EngineStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    torch::manual_seed(37);
    x_ = torch::randn({6, 4});
    y_ = torch::randn({6, 1});
  }
  EngineOptions Options(Home home) {
    EngineOptions o = engine_testing::Options(home, home, dir_.path());
    o.sub_group_size = 30;
    o.persistence_threshold = 8;  // unit biases resident
    return o;
  }
  std::unique_ptr<Engine> Trained(TinyNet& model, EngineOptions o, int steps = 2) {
    auto e = Engine::Create(model.ptr(), std::move(o));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return nullptr;
    for (int s = 0; s < steps; ++s) {
      EXPECT_TRUE((*e)->Backward(model->Loss(x_, y_)).ok());
      EXPECT_TRUE((*e)->Step().ok());
    }
    return std::move(*e);
  }
  Status Save(Engine& e, const std::string& tag) {
    auto w = CheckpointWriter::Begin(dir_.File("ckpt"), tag);
    if (!w.ok()) return w.status();
    STRATA_RETURN_IF_ERROR(e.SaveState(**w));
    return (*w)->Commit();
  }

  testing::TempDir dir_{"strata-engine-state-test"};
  torch::Tensor x_, y_;
};

TEST_F(EngineStateTest, ParameterValuesAreEveryTrainableParameterInModelOrder) {
  for (Home home : {Home::kDevice, Home::kNvme}) {
    SCOPED_TRACE(std::string(HomeName(home)));
    TinyNet model(3, 8);
    model->stem->bias.set_requires_grad(false);
    auto e = Trained(model, Options(home));
    ASSERT_NE(e, nullptr);
    auto values = e->ParameterValues();
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    std::vector<std::string> want;
    for (const auto& item : model->named_parameters()) {
      if (item.value().requires_grad()) want.push_back(item.key());
    }
    std::vector<std::string> got;
    for (const auto& [name, t] : *values) {
      got.push_back(name);
      EXPECT_EQ(t.scalar_type(), torch::kFloat32);
    }
    EXPECT_EQ(got, want);
    // Resident parameters are on the device, viewable: the values are theirs.
    EXPECT_TRUE(torch::equal((*values).back().second, model->head->bias.detach()));
  }
}

TEST_F(EngineStateTest, SafetensorsExportHoldsTheParameterValues) {
  TinyNet model(3, 8);
  auto e = Trained(model, Options(Home::kNvme));
  ASSERT_NE(e, nullptr);
  const std::string path = dir_.File("model.safetensors");
  STRATA_ASSERT_OK(e->ExportSafetensors(path, {{"step", "2"}}));
  std::map<std::string, std::string> meta;
  auto index = ReadSafetensorsIndex(path, &meta);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(meta["step"], "2");
  auto values = e->ParameterValues();
  ASSERT_TRUE(values.ok());
  ASSERT_EQ(index->size(), values->size());
  std::map<std::string, torch::Tensor> by_name(values->begin(), values->end());
  std::ifstream in(path, std::ios::binary);
  for (const SafetensorsTensor& t : *index) {
    SCOPED_TRACE(t.spec.name);
    ASSERT_EQ(by_name.count(t.spec.name), 1u);
    const torch::Tensor& want = by_name[t.spec.name];
    EXPECT_EQ(t.spec.dtype, "F32");
    EXPECT_EQ(t.spec.shape, want.sizes().vec());
    ASSERT_EQ(t.end - t.begin, static_cast<uint64_t>(want.numel()) * 4);
    torch::Tensor got = torch::empty_like(want);
    in.seekg(static_cast<std::streamoff>(t.begin));
    in.read(static_cast<char*>(got.data_ptr()), static_cast<std::streamsize>(t.end - t.begin));
    EXPECT_TRUE(torch::equal(got, want));
  }
}

TEST_F(EngineStateTest, SaveInTheMiddleOfAccumulationIsRefused) {
  EngineOptions o = Options(Home::kCpu);
  o.gradient_accumulation_steps = 2;
  TinyNet model(2, 8);
  auto e = Trained(model, o, 0);
  ASSERT_NE(e, nullptr);
  STRATA_ASSERT_OK(e->Backward(model->Loss(x_, y_)));
  Status s = Save(*e, "mid");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  STRATA_ASSERT_OK(e->Backward(model->Loss(x_, y_)));
  STRATA_ASSERT_OK(e->Step());
  STRATA_EXPECT_OK(Save(*e, "boundary"));
}

TEST_F(EngineStateTest, LoadRefusesAnotherModeOptimizerOrLayout) {
  TinyNet model(2, 8);
  auto e = Trained(model, Options(Home::kNvme));
  ASSERT_NE(e, nullptr);
  STRATA_ASSERT_OK(Save(*e, "adamw"));
  auto reader = CheckpointReader::Open(dir_.File("ckpt"), "adamw");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();

  struct Case {
    std::string name;
    EngineOptions options;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({"no offload", Options(Home::kDevice), "offload mode"});
  cases.push_back({"adam", Options(Home::kNvme), "optimizer \"adamw\" saved"});
  cases.back().options.optimizer_options.type = cpu_optimizer::OptimizerType::kAdam;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TinyNet other(2, 8);
    auto f = Engine::Create(other.ptr(), c.options);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Status s = (*f)->LoadState(*reader);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.ToString().find(c.says), std::string::npos) << s.ToString();
    EXPECT_EQ((*f)->global_steps(), 0);
  }

  // Another sub_group_size loads: the state is read by element ranges from the pieces the
  // checkpoint lists (as a checkpoint of another world size is), to the same values.
  {
    EngineOptions o = Options(Home::kNvme);
    o.sub_group_size = 40;
    TinyNet other(2, 8);
    auto f = Engine::Create(other.ptr(), o);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    STRATA_ASSERT_OK((*f)->LoadState(*reader));
    auto want = e->ParameterValues();
    auto got = (*f)->ParameterValues();
    ASSERT_TRUE(want.ok() && got.ok());
    ASSERT_EQ(want->size(), got->size());
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_TRUE(torch::equal((*want)[i].second, (*got)[i].second)) << (*want)[i].first;
    }
  }

  // The same configuration loads, with the steps.
  TinyNet same(2, 8);
  auto g = Engine::Create(same.ptr(), Options(Home::kNvme));
  ASSERT_TRUE(g.ok());
  STRATA_ASSERT_OK((*g)->LoadState(*reader));
  EXPECT_EQ((*g)->global_steps(), 2);
  auto want = e->ParameterValues(), got = (*g)->ParameterValues();
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_TRUE(torch::equal((*want)[i].second, (*got)[i].second)) << (*want)[i].first;
  }
}

}  // namespace
}  // namespace strata::runtime
