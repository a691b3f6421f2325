// Trains a GPT of --layers blocks (width --width) for 3 steps under full NVMe offload with fixed
// budgets, and prints the peak resident set size (VmHWM, KiB) reached during training, i.e. after
// the engine took the model's initial values (the peak is reset there via /proc/self/clear_refs).
// Used by rss_test.cc: host memory must not grow with the number of blocks.
#include <malloc.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "runtime/engine/engine.h"
#include "runtime/models/gpt.h"

namespace {

long ReadStatusKb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0)
      return std::strtol(line.c_str() + std::strlen(key) + 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: rss_probe LAYERS WIDTH NVME_DIR\n");
    return 2;
  }
  using namespace strata::runtime;
  using strata::Home;
  torch::set_num_threads(1);
  GptOptions g;
  g.n_layers = std::atoi(argv[1]);
  g.d_model = std::atoi(argv[2]);
  g.n_heads = 4;
  g.seq_len = 32;
  torch::manual_seed(0);
  Gpt model(g);
  const uint64_t block = 12ull * g.d_model * g.d_model + 13ull * g.d_model;
  const uint64_t resident = 2ull * 256 * g.d_model + 32ull * g.d_model + 2ull * g.d_model;
  EngineOptions o;
  o.params = Home::kNvme;
  o.optimizer = Home::kNvme;
  o.param_nvme_path = argv[3];
  o.optimizer_nvme_path = argv[3];
  o.persistence_threshold = 0;
  o.pin_memory = false;
  o.optimizer_options.threads = 1;
  o.device_budget = (resident + 2 * block) * 4 + (1 << 20);  // resident + 2 units, fixed
  auto engine = Engine::Create(model.ptr(), o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  malloc_trim(0);
  { std::ofstream("/proc/self/clear_refs") << "5"; }  // reset VmHWM to the current RSS
  const long start = ReadStatusKb("VmRSS:");
  for (int step = 0; step < 3; ++step) {
    auto seq = torch::randint(0, 256, {1, 33}, torch::kLong);
    auto loss = model->Loss(seq.narrow(1, 0, 32), seq.narrow(1, 1, 32));
    strata::Status s = (*engine)->Backward(loss);
    if (s.ok()) s = (*engine)->Step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("%ld %ld %llu\n", ReadStatusKb("VmHWM:"), start,
              static_cast<unsigned long long>((*engine)->pinned_arena_bytes()));
  return 0;
}
