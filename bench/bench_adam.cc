// `strata bench adam`: how close the fused CPU optimizer step runs to the memory system's speed,
// and how it compares with libtorch's optimizer on the same numel and threads.
//
// In one run, with the same thread count, ISA and chunking throughout:
//  1. STREAM triad a = b + s*c on three fp32 arrays of numel elements (24 B/element, STREAM's
//     count); buffers freed afterwards.
//  2. The optimizer step on flat buffers of numel elements (p, m, v, g, optional copy-out), counted
//     with the exact bytes it reads and writes (CpuOptimizer::BytesPerElement).
//  3. The Adam-pattern roofline: the same buffers and streams with x = g*0 + x (bandwidth.h),
//     timed alternately with 2 so that load changes on a shared machine hit both alike.
//  4. libtorch's step (torch::optim::AdamW etc.) after strata's buffers are freed.
// Each phase runs one untimed pass, then --iters timed passes; rates use the fastest pass (STREAM's
// convention), and the median is reported too. Buffers are 2 MiB aligned and madvise'd for
// transparent huge pages, and first touched by the same threads before timing.
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "bench/adam_torch.h"
#include "bench/commands.h"
#include "cpu_optimizer/bandwidth.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/commands/flag_checks.h"

namespace strata::bench {
namespace {

namespace co = cpu_optimizer;

struct AdamFlags {
  std::string numel = "256M";
  std::string optimizer = "adamw";
  std::string grad_dtype = "fp32";
  std::string copy_out = "none";
  std::string moments = "fp32";
  int threads = 0;
  std::string isa = "auto";
  int iters = 5;
  bool no_torch = false;
};

// A 2 MiB-aligned, huge-page-advised heap buffer.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(AlignUp(std::max<size_t>(bytes, 1), 2 * kMiB)) {
    ptr_ = std::aligned_alloc(2 * kMiB, bytes_);
    if (ptr_ != nullptr) madvise(ptr_, bytes_, MADV_HUGEPAGE);
  }
  ~Buffer() { std::free(ptr_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

struct Timing {
  double best = 0, median = 0;
};

// One untimed pass, then `iters` timed ones.
Result<Timing> TimePasses(int iters, const std::function<Status()>& pass) {
  STRATA_RETURN_IF_ERROR(pass());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    Stopwatch sw;
    STRATA_RETURN_IF_ERROR(pass());
    t.push_back(sw.Seconds());
  }
  std::sort(t.begin(), t.end());
  return Timing{t.front(), t[t.size() / 2]};
}

// First touch with the benchmark's threads, so pages are faulted in before timing.
void ParallelFill(tbb::task_arena& arena, size_t n, const std::function<void(size_t, size_t)>& fn) {
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, size_t{1} << 16),
                      [&](const tbb::blocked_range<size_t>& r) { fn(r.begin(), r.end()); });
  });
}

float GradValue(size_t i) { return (static_cast<float>(i % 1009) - 504.0f) * 1e-5f; }

void Store(void* base, DType dtype, size_t i, float x) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(base)[i] = x;
  } else if (dtype == DType::kFloat16) {
    static_cast<uint16_t*>(base)[i] = co::FloatToHalf(x);
  } else {
    static_cast<uint16_t*>(base)[i] = co::FloatToBf16(x);
  }
}

Status RunBenchAdam(const AdamFlags& f, nlohmann::json& j) {
  // ---- Flags -----------------------------------------------------------------------------------
  Result<uint64_t> numel = ParseBytes(f.numel);
  if (!numel.ok()) return numel.status().WithContext("--numel");
  if (*numel == 0) return InvalidArgumentError("--numel must be > 0");
  Result<co::OptimizerType> type = co::ParseOptimizerType(f.optimizer);
  if (!type.ok()) return type.status().WithContext("--optimizer");
  Result<DType> grad_dtype = ParseDType(f.grad_dtype);
  if (!grad_dtype.ok()) return grad_dtype.status().WithContext("--grad-dtype");
  Result<DType> moments = ParseDType(f.moments);
  if (!moments.ok() || *moments == DType::kFloat16) {
    return InvalidArgumentError("--moments must be fp32 or bf16, got '" + f.moments + "'");
  }
  std::optional<DType> copy_out;
  if (f.copy_out != "none") {
    Result<DType> c = ParseDType(f.copy_out);
    if (!c.ok() || *c == DType::kFloat32) {
      return InvalidArgumentError("--copy-out must be none, fp16 or bf16, got '" + f.copy_out +
                                  "'");
    }
    copy_out = *c;
  }
  if (f.threads < 0) return InvalidArgumentError("--threads must be >= 0");
  if (f.iters < 1) return InvalidArgumentError("--iters must be >= 1");
  Result<co::Isa> requested_isa = co::ParseIsa(f.isa);
  if (!requested_isa.ok()) return requested_isa.status().WithContext("--isa");

  co::OptimizerOptions options = co::OptimizerOptions::Defaults(*type);
  options.threads = f.threads;
  options.isa = *requested_isa;
  // Unavailable (a forced ISA this CPU lacks) exits 1, a bad option 2 (runtime/commands/command.h).
  Result<co::CpuOptimizer> opt = co::CpuOptimizer::Create(options);
  if (!opt.ok()) return opt.status();
  const int threads = opt->threads();
  const co::Isa isa = opt->isa();
  const size_t n = *numel;
  tbb::task_arena arena(threads);

  // ---- 1. STREAM triad -------------------------------------------------------------------------
  Timing triad;
  {
    Buffer a(n * 4), b(n * 4), c(n * 4);
    if (!a.get() || !b.get() || !c.get()) {
      return ResourceExhaustedError("cannot allocate triad arrays");
    }
    ParallelFill(arena, n, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        a.as<float>()[i] = 0.0f;
        b.as<float>()[i] = 1.0f;
        c.as<float>()[i] = 2.0f;
      }
    });
    Result<Timing> t = TimePasses(f.iters, [&] {
      return co::Triad(a.as<float>(), b.as<float>(), c.as<float>(), 3.0f, n, threads, isa);
    });
    if (!t.ok()) return t.status();
    triad = *t;
  }

  // ---- 2, 3. Kernel and Adam-pattern roofline ---------------------------------------------------
  const bool uses_m = *type != co::OptimizerType::kAdagrad;
  const bool uses_v = *type != co::OptimizerType::kLion;
  const size_t msize = DTypeBytes(*moments);
  Timing kernel, roofline;
  {
    Buffer p(n * 4), g(n * DTypeBytes(*grad_dtype));
    Buffer m(uses_m ? n * msize : 0), v(uses_v ? n * msize : 0), out(copy_out ? n * 2 : 0);
    co::FlatSpan span;
    span.numel = n;
    span.params = p.as<float>();
    span.exp_avg = uses_m ? m.get() : nullptr;
    span.exp_avg_sq = uses_v ? v.get() : nullptr;
    span.moment_dtype = *moments;
    span.grads = g.get();
    span.grad_dtype = *grad_dtype;
    span.copy_out = copy_out ? out.get() : nullptr;
    if (copy_out) span.copy_out_dtype = *copy_out;
    ParallelFill(arena, n, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        p.as<float>()[i] = 1.0f + static_cast<float>(i % 977) * 1e-4f;
        Store(g.get(), *grad_dtype, i, GradValue(i));
        if (uses_m) Store(m.get(), *moments, i, 0.0f);
        if (uses_v) Store(v.get(), *moments, i, 0.0f);
        if (copy_out) out.as<uint16_t>()[i] = 0;
      }
    });
    // Kernel steps and roofline passes alternate, so a change in the machine's load (it may be
    // shared) hits both alike; each keeps its own best and median.
    int64_t step = 0;
    auto kernel_pass = [&] {
      co::StepArgs args;
      args.step = ++step;
      return opt->Step(span, args);
    };
    auto roofline_pass = [&] { return co::AdamPatternPass(*type, span, threads, isa); };
    std::vector<double> kt, rt;
    for (int i = 0; i <= f.iters; ++i) {  // pass 0 is the warm-up
      Stopwatch sw;
      Status s = kernel_pass();
      if (!s.ok()) return s;
      if (i > 0) kt.push_back(sw.Seconds());
      sw.Reset();
      s = roofline_pass();
      if (!s.ok()) return s;
      if (i > 0) rt.push_back(sw.Seconds());
    }
    std::sort(kt.begin(), kt.end());
    std::sort(rt.begin(), rt.end());
    kernel = Timing{kt.front(), kt[kt.size() / 2]};
    roofline = Timing{rt.front(), rt[rt.size() / 2]};
  }

  // ---- 4. libtorch -----------------------------------------------------------------------------
  std::optional<TorchStepTiming> torch_timing;
  std::string torch_note;
  if (f.no_torch) {
    torch_note = "skipped (--no-torch)";
  } else {
    Result<TorchStepTiming> t = TimeTorchOptimizer(f.optimizer, n, threads, std::min(f.iters, 3));
    if (t.ok()) {
      torch_timing = *t;
    } else {
      torch_note = std::string(t.status().message());
    }
  }

  // ---- Report ----------------------------------------------------------------------------------
  const size_t bpe = co::CpuOptimizer::BytesPerElement(*type, *grad_dtype, *moments, copy_out);
  const double dn = static_cast<double>(n);
  const double kernel_eps = dn / kernel.best;
  const double kernel_gbps = kernel_eps * static_cast<double>(bpe) / 1e9;
  const double roofline_gbps = dn * static_cast<double>(bpe) / roofline.best / 1e9;
  const double triad_gbps = dn * static_cast<double>(co::kTriadBytesPerElement) / triad.best / 1e9;
  const std::string copy_name = copy_out ? std::string(DTypeName(*copy_out)) : "none";

  j["numel"] = n;
  j["threads"] = threads;
  j["isa"] = co::IsaName(isa);
  j["optimizer"] = f.optimizer;
  j["grad_dtype"] = DTypeName(*grad_dtype);
  j["moments"] = DTypeName(*moments);
  j["copy_out"] = copy_name;
  j["iters"] = f.iters;
  j["kernel"] = {{"elements_per_s", kernel_eps},
                 {"gbps", kernel_gbps},
                 {"bytes_per_element", bpe},
                 {"best_s", kernel.best},
                 {"median_s", kernel.median}};
  j["triad_gbps"] = triad_gbps;
  j["triad_bytes_per_element"] = co::kTriadBytesPerElement;
  j["roofline_gbps"] = roofline_gbps;
  j["roofline_elements_per_s"] = dn / roofline.best;
  j["fraction_of_triad"] = kernel_gbps / triad_gbps;
  j["fraction_of_roofline"] = kernel_gbps / roofline_gbps;
  if (torch_timing) {
    const double torch_eps = dn / torch_timing->best_seconds;
    j["torch"] = {{"elements_per_s", torch_eps},
                  {"best_s", torch_timing->best_seconds},
                  {"median_s", torch_timing->median_seconds},
                  {"steps", torch_timing->steps},
                  {"speedup", kernel_eps / torch_eps}};
  } else {
    j["torch_note"] = torch_note;
  }
  return Status::Ok();
}

void PrintAdam(const nlohmann::json& j, std::FILE* out) {
  auto str = [](const nlohmann::json& v) { return v.get<std::string>(); };
  auto num = [](const nlohmann::json& v) { return v.get<double>(); };
  const nlohmann::json& k = j["kernel"];
  const double kernel_gbps = num(k["gbps"]);
  std::fprintf(out,
               "strata bench adam: %s, %zu elements, grad %s, moments %s, copy-out %s, isa %s, "
               "%d threads, best of %d\n",
               str(j["optimizer"]).c_str(), j["numel"].get<size_t>(), str(j["grad_dtype"]).c_str(),
               str(j["moments"]).c_str(), str(j["copy_out"]).c_str(), str(j["isa"]).c_str(),
               j["threads"].get<int>(), j["iters"].get<int>());
  std::fprintf(
      out, "  kernel    %6.3f G elem/s  %6.2f GB/s  (%zu B/elem; step %.1f ms, median %.1f ms)\n",
      num(k["elements_per_s"]) / 1e9, kernel_gbps, k["bytes_per_element"].get<size_t>(),
      num(k["best_s"]) * 1e3, num(k["median_s"]) * 1e3);
  std::fprintf(out,
               "  roofline  %6.3f G elem/s  %6.2f GB/s  (same streams in place, trivial math)\n",
               num(j["roofline_elements_per_s"]) / 1e9, num(j["roofline_gbps"]));
  std::fprintf(out, "  triad                    %6.2f GB/s  (STREAM a = b + s*c, 24 B/elem)\n",
               num(j["triad_gbps"]));
  std::fprintf(out, "  kernel / roofline = %.3f   kernel / triad = %.3f\n",
               num(j["fraction_of_roofline"]), num(j["fraction_of_triad"]));
  if (j.contains("torch")) {
    const nlohmann::json& t = j["torch"];
    std::fprintf(out,
                 "  torch     %6.3f G elem/s  (torch::optim %s step %.1f ms, median %.1f ms)\n",
                 num(t["elements_per_s"]) / 1e9, str(j["optimizer"]).c_str(),
                 num(t["best_s"]) * 1e3, num(t["median_s"]) * 1e3);
    std::fprintf(out, "  kernel / torch = %.2fx\n", num(t["speedup"]));
  } else {
    std::fprintf(out, "  torch: %s\n", str(j["torch_note"]).c_str());
  }
}

class BenchAdamCommand final : public Command {
 public:
  BenchAdamCommand()
      : Command(
            "adam",
            "Fused CPU optimizer step vs. memory ceilings (STREAM triad, Adam-pattern roofline) "
            "and libtorch") {}
  void AddFlags(CLI::App& cmd) override {
    AdamFlags& f = flags_;
    cmd.add_option("--numel", f.numel, "Elements per buffer, e.g. 256M = 256*2^20 (default 256M)")
        ->check(runtime::flags::ByteSize(1, uint64_t{1} << 40));
    cmd.add_option("--optimizer", f.optimizer, "adam|adamw|adagrad|lion (default adamw)")
        ->check(CLI::IsMember({"adam", "adamw", "adagrad", "lion"}));
    cmd.add_option("--grad-dtype", f.grad_dtype, "fp32|fp16|bf16 (default fp32)")
        ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
    cmd.add_option("--copy-out", f.copy_out,
                   "none|fp16|bf16: also write the updated params rounded (default none)")
        ->check(CLI::IsMember({"none", "fp16", "bf16"}));
    cmd.add_option("--moments", f.moments, "fp32|bf16 storage for m and v (default fp32)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    cmd.add_option("--threads", f.threads, "Threads for every phase (default 0: all cores)")
        ->check(runtime::flags::Threads(0));
    cmd.add_option("--isa", f.isa, "auto|avx512|avx2|scalar (default auto: STRATA_CPU_ISA or best)")
        ->check(CLI::IsMember({"auto", "avx512", "avx2", "scalar"}));
    cmd.add_option("--iters", f.iters, "Timed passes per phase after one warm-up (default 5)")
        ->check(CLI::Range(1, 1000000));
    cmd.add_flag("--no-torch", f.no_torch, "Skip the libtorch comparison");
  }
  Status Run(runtime::CommandContext& /*ctx*/, nlohmann::json& j) override {
    return RunBenchAdam(flags_, j);
  }
  void PrintText(const nlohmann::json& j, std::FILE* out) const override { PrintAdam(j, out); }

 private:
  AdamFlags flags_;
};

}  // namespace

std::unique_ptr<Command> NewBenchAdamCommand() { return std::make_unique<BenchAdamCommand>(); }

}  // namespace strata::bench
