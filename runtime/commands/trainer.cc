// Trainer: see trainer.h. This file runs the steps (Run, one micro-batch's forward and backward,
// the data each reads) and saves, exports and evaluates between them; trainer_setup.cc builds the
// state it runs over (trainer_impl.h), checkpointing.h writes and reads checkpoints,
// model_export.h writes Hugging Face directories and evaluator.h evaluates.
//
// Run draws micro-batch i from the data by its index alone. Together with the order Create
// consumes randomness in and the checkpointed step and data position, that is what makes a
// resumed run bitwise equal to a straight one (tests/integration/train_cli_test.cc).
#include "runtime/commands/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "runtime/commands/checkpointing.h"
#include "runtime/commands/evaluator.h"
#include "runtime/commands/model_export.h"
#include "runtime/commands/save_dir.h"
#include "runtime/commands/trainer_impl.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"
#include "runtime/plan/step_traffic.h"

namespace strata::runtime {

Status Trainer::Impl::FillMicroBatch(int micro, torch::Tensor* x, torch::Tensor* y,
                                     double* trained) const {
  const int batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  *x = torch::empty({batch, seq_len}, torch::kLong);
  *y = torch::empty({batch, seq_len}, torch::kLong);
  // The step's global batch is samples [samples, samples + micro × gas × world): micro-batch k of
  // rank r takes rows (k × world + r) × micro onwards.
  const uint64_t first =
      samples + (static_cast<uint64_t>(micro) * world + rank) * static_cast<uint64_t>(batch);
  STRATA_RETURN_IF_ERROR(
      data->Train(batch, seq_len, first, x->data_ptr<int64_t>(), y->data_ptr<int64_t>()));
  if (trained != nullptr) {
    const int64_t* t = y->data_ptr<int64_t>();
    *trained += static_cast<double>(
        std::count_if(t, t + y->numel(), [](int64_t v) { return v != kIgnoredTarget; }));
  }
  if (!torch_device.is_cpu()) {  // to the GPU once per micro-batch
    *x = x->to(torch_device);
    *y = y->to(torch_device);
  }
  return Status::Ok();
}

Result<double> Trainer::Impl::MicroBatch(const torch::Tensor& x, const torch::Tensor& y,
                                         double* forward_seconds, double* backward_seconds,
                                         std::optional<double> sum_scale) {
  Stopwatch fw;
  torch::Tensor loss, value_of;
  try {
    TraceSpan span("compute", "forward");
    if (sum_scale) {
      // Summed over the trained targets (kIgnoredTarget is cross_entropy's ignore_index) in fp32,
      // as NextTokenLoss computes; the backward's scale makes the step's gradient that of the
      // global sum over the global count (Run).
      const torch::Tensor logits = lm->Logits(x);
      value_of = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), y.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions()
              .reduction(torch::kSum)
              .ignore_index(kIgnoredTarget));
      loss = value_of * *sum_scale;
      // A mixture of experts' router aux loss joins each micro-batch's objective as transformers
      // adds it to the loss of its forward (models/moe.h).
      if (torch::Tensor aux = lm->AuxiliaryLoss(); aux.defined()) {
        loss = loss + aux;
        value_of = value_of + aux / *sum_scale;
      }
    } else {
      loss = lm->Loss(x, y);
      value_of = loss;
    }
  } catch (const std::exception& e) {  // a unit's gather failed (e.g. an NVMe read error)
    return ComputeError("the forward", engine->ErrorFromException(e));
  }
  double value = 0;
  try {
    value = value_of.item<double>();  // on a GPU: waits for the forward
  } catch (const std::exception& e) {
    return ComputeError("the forward", engine->ErrorFromException(e));
  }
  *forward_seconds += fw.Seconds();
  Stopwatch bw;
  {
    TraceSpan span("compute", "backward");
    STRATA_RETURN_IF_ERROR(ComputeError("the backward", engine->Backward(loss)));
    STRATA_RETURN_IF_ERROR(ComputeError("the backward", engine->WaitForCompute()));
  }
  *backward_seconds += bw.Seconds();
  return value;
}

Status Trainer::Impl::ComputeError(const std::string& phase, Status s) const {
  if (s.ok()) return s;
  const std::string what(s.message());
  if (what.find("out of memory") == std::string::npos) return s;
  // libtorch's message says what it tried to allocate and what was free; the first line is enough.
  const std::string first = what.substr(0, std::min(what.find('\n'), size_t{400}));
  const uint64_t budget = device != nullptr ? device->info().budget_bytes : 0;
  return ResourceExhaustedError(
      "the device ran out of memory in " + phase + " (" + first + "); strata's parameter copies " +
      "may take " + FormatBytes(budget) + " of it (--device-memory): lower " +
      "train_micro_batch_size_per_gpu or --seq-len, set --device-memory lower, or offload the " +
      "parameters (zero_optimization.offload_param)");
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  STRATA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

CausalLm& Trainer::model() { return *impl_->lm; }
Engine& Trainer::engine() { return *impl_->engine; }
c10::Device Trainer::torch_device() const { return impl_->torch_device; }
std::string Trainer::device_description() const {
  return impl_->device ? impl_->device_description
                       : "host (emulated; libtorch computes on the CPU)";
}
Status Trainer::ComputeError(const std::string& phase, Status s) {
  return impl_->ComputeError(phase, std::move(s));
}

const Config& Trainer::config() const { return impl_->config; }
int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::steps() const { return impl_->options.steps; }
std::optional<Trainer::Best> Trainer::best() const { return impl_->best; }
int Trainer::seq_len() const { return impl_->seq_len; }

nlohmann::json Trainer::PlanFacts() const {
  nlohmann::json j = {{"seq_len", impl_->seq_len},
                      {"micro_batch", impl_->config.train_micro_batch_size_per_gpu}};
  if (std::optional<ModelLayout> layout = impl_->engine->plan_layout()) {
    j["units"] = layout->unit_numel.size();
    j["unit_params"] = layout->unit_numel.empty() ? 0 : layout->unit_numel.front();
    j["resident_params"] = layout->resident_numel;
    j["pinned_arena_bytes"] = impl_->engine->pinned_arena_bytes();
  }
  if (std::optional<PlanInput> in = impl_->engine->plan_input()) {
    // The host-RAM tier (pinned bytes per block class kept in RAM instead of on NVMe) and the
    // NVMe bytes per step the layout moves with that split and this run's device window
    // (step_traffic.h: from the second step, writes exact, reads too for dense models).
    const HostCacheSplit split = SplitHostCache(*in);
    j["host_cache_bytes"] = split.bytes();
    j["host_cache_grad_bytes"] = split.grad_bytes;
    j["host_cache_state_bytes"] = split.state_bytes;
    j["host_cache_param_bytes"] = split.unit_bytes;
    // The budget (this rank's share; 0: none) and what it holds beside the pinned arena.
    j["host_budget_bytes"] = impl_->engine->options().host_cache_budget;
    j["host_beside_bytes"] = impl_->engine->options().host_beside.total();
    if (!in->inference) {
      const StepTraffic t =
          NvmeTrafficPerStep(*in, static_cast<int>(impl_->config.gradient_accumulation_steps));
      j["plan_nvme_read_bytes"] = std::llround(t.read());
      j["plan_nvme_written_bytes"] = std::llround(t.written());
    }
  }
  return j;
}

std::string Trainer::model_description() const { return impl_->lm->Describe(); }

Result<RunSummary> Trainer::Run(const std::function<void(const StepReport&)>& on_step,
                                const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  const TrainerOptions& o = m.options;
  if (o.inference || m.data == nullptr) {
    return FailedPreconditionError("Run: the trainer was built for inference, without training");
  }
  const int gas = static_cast<int>(m.config.gradient_accumulation_steps);
  RunSummary summary;
  summary.first_loss = NAN;
  Stopwatch run_watch;
  auto stopping = [&]() -> Result<bool> {
    double stop_now = stop != nullptr && stop->load() ? 1 : 0;
    // Ranks stop together (a signal reaches them at different moments), between the same steps.
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&stop_now, 1));
    return stop_now > 0;
  };
  for (;;) {
    if (m.step >= o.steps) break;
    STRATA_ASSIGN_OR_RETURN(const bool stop_now, stopping());
    // What happens next was said when the signal came (train_command.cc's InterruptNotice).
    if (stop_now) break;
    if (m.step + 1 == m.trace_from) {
      TraceRecorder::Global().Clear();
      TraceRecorder::Global().Enable(true);
    }
    const TierTelemetry before = m.engine->telemetry();
    const Engine::SpeculativeReads speculative_before = m.engine->speculative_reads();
    const PageFaults faults_before = ProcessPageFaults();
    Stopwatch w;
    StepReport r;
    double loss_sum = 0;
    int first_bad = 0;  // the first micro-batch (1-based) whose loss is not finite, or 0
    bool bad_is_nan = false;
    // The step's data is read before its first forward: a token file that changed under the
    // run ends it between steps, where its state can still be saved.
    std::vector<torch::Tensor> xs(gas), ys(gas);
    Status filled;
    // Masked data (SFT): the targets trained on, counted before the first forward.
    const bool masked = m.data->Masked();
    double trained = 0;
    for (int micro = 0; micro < gas && filled.ok(); ++micro) {
      filled = m.FillMicroBatch(micro, &xs[micro], &ys[micro], masked ? &trained : nullptr);
    }
    double data_failed = filled.ok() ? 0 : 1;
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&data_failed, 1));
    if (data_failed > 0) {
      if (filled.ok()) {
        filled = DataLossError("step " + std::to_string(m.step + 1) +
                               ": another rank could not read its training data");
      }
      if (!o.save.empty()) {
        STRATA_LOG(kWarning) << "saving step " << m.step
                             << " before stopping: " << filled.message();
        if (Status saved = Save(); !saved.ok()) {
          STRATA_LOG(kError) << "the save before stopping failed: " << saved.ToString();
        }
      }
      return filled;
    }
    // Masked data: the step's loss is the global batch's summed token losses over its trained
    // targets (transformers' num_items_in_batch). The engine divides each backward by gas and
    // averages ranks, so each micro-batch's sum is scaled by gas x world / the global count.
    std::optional<double> sum_scale;
    if (masked) {
      if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&trained, 1));
      // A global batch with no trained target (all its completions truncated away) moves nothing.
      sum_scale = trained > 0 ? static_cast<double>(gas) * m.world / trained : 0.0;
    }
    for (int micro = 0; micro < gas; ++micro) {
      STRATA_ASSIGN_OR_RETURN(double loss, m.MicroBatch(xs[micro], ys[micro], &r.forward_seconds,
                                                        &r.backward_seconds, sum_scale));
      if (!std::isfinite(loss) && first_bad == 0) {
        first_bad = micro + 1;
        bad_is_nan = std::isnan(loss);
      }
      loss_sum += loss;
    }
    // The logged loss is the global batch's mean (runs on any number of ranks compare), and ranks
    // decide together whether a loss was not finite, so that they all stop at the same point.
    double sums[2] = {loss_sum, first_bad != 0 ? 1.0 : 0.0};
    if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(sums, 2));
    // Outside fp16 (whose loss scaler skips the step) a non-finite loss is a diverged or broken
    // run: stop before its gradients reach the optimizer, so the state of the last step (and
    // every checkpoint written so far) stays good.
    if (sums[1] > 0 && !m.config.fp16.enabled) {
      const std::string which =
          first_bad != 0 ? "the loss of micro-batch " + std::to_string(first_bad) + " of " +
                               std::to_string(gas) + " is " + (bad_is_nan ? "NaN" : "infinite") +
                               (m.world > 1 ? " on rank " + std::to_string(m.rank) : "")
                         : "the loss of a micro-batch on another rank is not finite";
      return FailedPreconditionError(
          "step " + std::to_string(m.step + 1) + ": " + which +
          "; training stops before the optimizer step. Parameters and optimizer "
          "state are those of step " +
          std::to_string(m.step) +
          ", so checkpoints saved before are intact. Lower the learning rate, check the data "
          "and the model's weights, or train in bf16 or with fp16 loss scaling");
    }
    loss_sum = sums[0];
    r.lr = m.engine->learning_rate();
    r.loss_scale = m.engine->loss_scale();  // what the backward passes above multiplied by
    Stopwatch ow;
    STRATA_RETURN_IF_ERROR(m.engine->Step());
    m.samples += static_cast<uint64_t>(m.config.train_micro_batch_size_per_gpu) * gas * m.world;
    r.skipped = m.engine->last_step_skipped();
    r.optimizer_seconds = ow.Seconds();
    r.step_seconds = w.Seconds();
    const PageFaults faults_after = ProcessPageFaults();
    r.minor_faults = faults_after.minor - faults_before.minor;
    r.major_faults = faults_after.major - faults_before.major;
    r.step = ++m.step;
    r.steps = o.steps;
    const TierTelemetry after = m.engine->telemetry();
    r.nvme_read_bytes = after.nvme_to_pinned - before.nvme_to_pinned;
    r.nvme_written_bytes = after.pinned_to_nvme - before.pinned_to_nvme;
    r.read_retries = after.read_retries - before.read_retries;
    if (m.engine->offloaded()) {
      const std::vector<bool> updated = m.engine->UnitsUpdatedByLastStep();
      r.units_updated = std::count(updated.begin(), updated.end(), true);
      const std::vector<bool> routed = m.engine->UnitsWithGradientsInLastStep();
      r.units_routed = std::count(routed.begin(), routed.end(), true);
    }
    const Engine::SpeculativeReads speculative_after = m.engine->speculative_reads();
    r.speculative_read_bytes = speculative_after.bytes - speculative_before.bytes;
    r.speculative_wasted_bytes = speculative_after.wasted_bytes - speculative_before.wasted_bytes;
    if (masked) {
      r.loss = trained > 0 ? loss_sum / trained : 0.0;
    } else {
      r.loss = loss_sum / (static_cast<double>(gas) * m.world);
    }
    if (std::isnan(summary.first_loss)) summary.first_loss = r.loss;
    r.tokens =
        static_cast<double>(m.config.train_micro_batch_size_per_gpu) * gas * m.world * m.seq_len;
    r.tokens_per_second = r.tokens / r.step_seconds;
    if (r.step == m.trace_to) {
      TraceRecorder::Global().Enable(false);
      STRATA_RETURN_IF_ERROR(TraceRecorder::Global().WriteJson(o.trace));
      STRATA_LOG(kInfo) << "wrote the Chrome trace of steps " << o.trace_steps << " to " << o.trace;
    }
    r.grad_norm = m.engine->last_grad_norm();
    const Engine::Occupancy occ = m.engine->occupancy();
    r.device_used_bytes = occ.device_used;
    r.device_budget_bytes = occ.device_budget;
    r.device_peak_bytes = occ.device_peak;
    r.device = m.device_description;
    r.pinned_used_bytes = occ.pinned_used;
    r.pinned_capacity_bytes = occ.pinned_capacity;
    const StepTimes& times = m.engine->times();
    r.gather_wait_seconds = times.gather_wait_seconds;
    r.grad_wait_seconds = times.grad_wait_seconds;
    r.engine_optimizer_seconds = times.optimizer_seconds;
    // The waits for the previous step's deferred updates were spent in forward (gathers) and at
    // Backward's start: they are optimizer time.
    r.optimizer_wait_seconds = times.optimizer_wait_seconds;
    const double from_forward = std::min(r.forward_seconds, r.optimizer_wait_seconds);
    r.forward_seconds -= from_forward;
    r.backward_seconds =
        std::max(0.0, r.backward_seconds - (r.optimizer_wait_seconds - from_forward));
    r.optimizer_seconds += r.optimizer_wait_seconds;
    r.epoch = m.EpochOf(m.samples);
    const bool completed_epoch = m.CompletedEpoch();
    bool improved = false;
    if (m.eval_data != nullptr &&
        (r.step == o.steps || (o.eval_every > 0 && r.step % o.eval_every == 0) ||
         (o.eval_every_epoch && completed_epoch))) {
      Result<EvalReport> evaluated = m.EvaluateOn(*m.eval_data, o.eval_max_batches);
      // Ranks agree on the outcome and take rank 0's loss (each evaluates the whole set; a last
      // bit of difference must not make one rank save the best and another not: Save is
      // collective). Adding zeros to rank 0's loss is exact.
      const StatusCode code = evaluated.ok() ? StatusCode::kOk : evaluated.status().code();
      // The data or the numbers (no trained token in the evaluated batches, a loss that is not
      // finite): that evaluation is skipped, training goes on. Anything else (an NVMe error)
      // ends the run, after a save.
      const bool skippable =
          code == StatusCode::kInvalidArgument || code == StatusCode::kFailedPrecondition;
      double agreed[3] = {evaluated.ok() || skippable ? 0.0 : 1.0, evaluated.ok() ? 0.0 : 1.0,
                          evaluated.ok() && m.rank == 0 ? evaluated->loss : 0.0};
      if (m.world > 1) STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(agreed, 3));
      if (agreed[0] > 0) {
        Status failed = evaluated.ok()
                            ? UnavailableError("the evaluation at step " + std::to_string(r.step) +
                                               " failed on another rank")
                            : evaluated.status();
        if (!o.save.empty()) {
          STRATA_LOG(kWarning) << "saving step " << m.step
                               << " before stopping: the evaluation failed: " << failed.message();
          if (Status saved = Save(); !saved.ok()) {
            STRATA_LOG(kError) << "the save before stopping failed: " << saved.ToString();
          }
        }
        return failed;
      }
      if (agreed[1] > 0) {
        if (m.rank == 0) {
          STRATA_LOG(kError) << "the evaluation after step " << r.step << " failed ("
                             << (evaluated.ok() ? std::string("on another rank")
                                                : std::string(evaluated.status().message()))
                             << "); training goes on without it";
        }
      } else {
        EvalReport e = *evaluated;
        e.loss = agreed[2];
        e.perplexity = std::exp(e.loss);
        m.last_eval = {{"step", r.step}, {"loss", e.loss}, {"perplexity", e.perplexity}};
        // HF's Trainer: the first evaluation is the best so far; later ones must be lower.
        improved = !m.best || e.loss < m.best->eval_loss;
        if (improved) m.best = Best{r.step, e.loss, ""};
        r.eval = e;
      }
    }
    r.elapsed_seconds = run_watch.Seconds();
    if (on_step) on_step(r);
    const bool save_due = (o.save_every > 0 && r.step % o.save_every == 0) ||
                          (o.save_every_epoch && completed_epoch) || (o.save_best && improved);
    // The last step is saved by the caller's Save (an interrupted run's too).
    if (!o.save.empty() && save_due && r.step < o.steps) STRATA_RETURN_IF_ERROR(Save());
  }
  summary.step = m.step;
  summary.interrupted = m.step < o.steps;
  return summary;
}

Status Trainer::Save() {
  Impl& m = *impl_;
  const std::string& dir = m.options.save;
  if (dir.empty()) return FailedPreconditionError("Trainer::Save without a checkpoint directory");
  // Saved already at this step (by save_every or --save-best before an interruption, or twice at
  // the end): the checkpoint is there.
  if (m.saved_step == m.step) return Status::Ok();
  Stopwatch w;
  CheckpointRun run = m.Checkpoints();
  // Named here so that the best checkpoint's tag is known before it is written (SaveCheckpoint
  // writes rank 0's; only rank 0 records and prunes).
  run.tag = SaveTag(dir, m.step, m.run_id);
  if (m.options.save_best && m.best && m.best->step == m.step) m.best->tag = run.tag;
  if (!m.last_eval.is_null()) run.trainer_state["eval"] = m.last_eval;
  if (m.best && !m.best->tag.empty()) {
    run.trainer_state["best"] = {
        {"step", m.best->step}, {"eval_loss", m.best->eval_loss}, {"tag", m.best->tag}};
  }
  STRATA_RETURN_IF_ERROR(SaveCheckpoint(run, dir, {m.step, m.samples}));
  m.saved_step = m.step;
  // Rank 0 alone prunes; its error is returned after the export, whose gathers every rank takes
  // part in.
  Status pruned;
  if (m.rank == 0) {
    // As Hugging Face's Trainer: the best checkpoint counts towards save_total_limit and is never
    // removed, and with a limit of 1 the newest is kept beside an older best (to resume from).
    const int limit = m.options.save_total_limit;
    const bool keeps_best = m.options.save_best && m.best && !m.best->tag.empty();
    int others = limit;
    if (keeps_best) others = limit > 1 ? limit - 1 : (m.best->step == m.step ? 0 : 1);
    pruned = PruneRunCheckpoints(dir, m.run_id, others, keeps_best ? m.best->tag : "");
  }
  if (m.lm->HfConfig().is_null()) {
    STRATA_RETURN_IF_ERROR(m.engine->ExportSafetensors(
        dir + "/model.safetensors",
        {{"format", "pt"}, {"step", std::to_string(m.step)}, {"model", m.options.model}}));
    if (m.rank == 0) {
      STRATA_LOG(kInfo) << "saved step " << m.step << " to " << dir << " (and " << dir
                        << "/model.safetensors) in " << w.Seconds() << " s";
    }
  } else {
    ExportOptions eo;
    eo.dir = dir + "/hf";
    eo.dtype = m.options.save_export_dtype;
    eo.max_shard_size = m.options.save_max_shard_size;
    STRATA_RETURN_IF_ERROR(Export(eo));
    if (m.rank == 0) {
      STRATA_LOG(kInfo) << "saved step " << m.step << " to " << dir << " (and the Hugging Face "
                        << "directory " << eo.dir << ") in " << w.Seconds() << " s";
    }
  }
  return pruned;
}

Status Trainer::CheckExport(const ExportOptions& eo) const {
  return CheckHfExport(*impl_->lm, impl_->options.model, eo);
}

Status Trainer::Export(const ExportOptions& eo) {
  Impl& m = *impl_;
  return ExportHf(*m.engine, *m.lm, m.options.model, m.rank, m.world, m.options.stop, eo);
}

Result<EvalReport> Trainer::Evaluate(int64_t max_batches) {
  if (impl_->data == nullptr) return FailedPreconditionError("Evaluate: the trainer has no data");
  return impl_->EvaluateOn(*impl_->data, max_batches);
}

Result<EvalReport> Trainer::Impl::EvaluateOn(const TrainingData& source, int64_t max_batches) {
  Impl& m = *this;
  Evaluation e;
  e.engine = m.engine.get();
  e.lm = m.lm.get();
  e.data = &source;
  e.batch = static_cast<int>(m.config.train_micro_batch_size_per_gpu);
  e.seq_len = m.seq_len;
  e.device = m.torch_device;
  e.compute_error = [&m](const std::string& phase, Status s) {
    return m.ComputeError(phase, std::move(s));
  };
  return runtime::Evaluate(e, max_batches);
}

}  // namespace strata::runtime
