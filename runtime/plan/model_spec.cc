#include "runtime/plan/model_spec.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <utility>

#include "base/json_text.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/plan/layout.h"

namespace strata::runtime {
namespace {

// DIR as a Hugging Face model: config.json, and its weights (required or optional).
Result<ModelSpec> ReadHfDirectory(std::string dir, Weights weights) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  Result<nlohmann::json> read = ReadJsonFile(config_path);
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError(config_path +
                         ": not found (a Hugging Face model directory holds "
                         "config.json and model*.safetensors)");
  }
  ModelSpec spec;
  STRATA_ASSIGN_OR_RETURN(spec.hf_config, std::move(read));
  STRATA_ASSIGN_OR_RETURN(LlamaShape shape, ParseHfConfig(spec.hf_config, config_path));
  shape.name = std::filesystem::path(dir).filename().string();
  if (shape.name.empty()) shape.name = dir;
  Result<std::unique_ptr<HfCheckpoint>> checkpoint = HfCheckpoint::Open(dir);
  if (checkpoint.ok()) {
    spec.checkpoint = std::move(*checkpoint);
    // The head train builds: a tied config over a distinct lm_head trains it untied, and exports
    // say so.
    const bool config_ties = shape.tie_word_embeddings;
    STRATA_RETURN_IF_ERROR(UntieADistinctHead(*spec.checkpoint, dir, &shape.tie_word_embeddings));
    if (config_ties && !shape.tie_word_embeddings) spec.hf_config["tie_word_embeddings"] = false;
  } else if (weights == Weights::kRequired) {
    return checkpoint.status();
  }
  spec.name = shape.name;
  spec.hf_dir = dir;
  spec.llama = std::move(shape);
  return spec;
}

}  // namespace

std::string ModelSpec::PresetNames() {
  std::string gpt, llama;
  for (const GptShape& s : GptPresets()) gpt += (gpt.empty() ? "" : ", ") + s.name;
  for (const LlamaShape& s : LlamaPresets()) llama += (llama.empty() ? "" : ", ") + s.name;
  return "GPT presets: " + gpt + "; Llama-family presets: " + llama;
}

Result<ModelSpec> ResolveModel(const std::string& model, int seq_len, Weights weights) {
  std::error_code ec;
  ModelSpec spec;
  if (std::filesystem::is_directory(model, ec)) {
    STRATA_ASSIGN_OR_RETURN(spec, ReadHfDirectory(model, weights));
  } else if (Result<GptShape> gpt = FindGptPreset(model); gpt.ok()) {
    spec.name = gpt->name;
    spec.gpt = std::move(*gpt);
    // The position table follows the length, as the model is built.
    if (seq_len > 0) spec.gpt->seq_len = seq_len;
  } else if (Result<LlamaShape> llama = FindLlamaPreset(model); llama.ok()) {
    spec.name = llama->name;
    spec.llama = std::move(*llama);
  } else if (std::filesystem::exists(model, ec)) {
    return InvalidArgumentError("--model " + model +
                                ": not a directory (give the Hugging Face model directory that "
                                "holds config.json)");
  } else {
    return NotFoundError("--model " + model +
                         " is neither a directory nor a preset (a Hugging Face model directory "
                         "with config.json and model*.safetensors, or one of the " +
                         ModelSpec::PresetNames() + ")");
  }
  spec.seq_len = seq_len > 0 ? seq_len : spec.gpt ? spec.gpt->seq_len : kDefaultLlamaSeqLen;
  return spec;
}

PlanSettings PlanSettingsFor(const Config& config) {
  PlanSettings out;
  const ZeroConfig& z = config.zero;
  constexpr int64_t kIntLimit = std::numeric_limits<int>::max();
  out.param_buffer_count = static_cast<int>(std::min(z.offload_param.buffer_count, kIntLimit));
  out.param_buffer_size = static_cast<uint64_t>(z.offload_param.buffer_size.value_or(0));
  out.max_in_cpu = static_cast<uint64_t>(z.offload_param.max_in_cpu.value_or(0));
  out.optimizer_buffer_count =
      static_cast<int>(std::min(z.offload_optimizer.buffer_count, kIntLimit));
  out.pipeline = z.offload_optimizer.pipeline_read || z.offload_optimizer.pipeline_write;
  out.sub_group_size = static_cast<uint64_t>(z.sub_group_size);
  out.persistence_threshold = static_cast<uint64_t>(z.param_persistence_threshold);
  out.device_prefetch_elements = static_cast<uint64_t>(
      std::max<int64_t>(0, std::min(z.prefetch_bucket_size, z.max_live_parameters)));
  if (config.fp16.enabled) {
    out.compute_bytes = 2;
    out.dtype = "fp16";
  } else if (config.bf16.enabled) {
    out.compute_bytes = 2;
    out.dtype = "bf16";
  }
  if (config.optimizer) {
    // The fp32 master, then the moments (bf16 with bf16.bf16_optimizer_states).
    const uint64_t moment_bytes = config.bf16.enabled && config.bf16.optimizer_states ? 2 : 4;
    out.state_bytes = static_cast<int>(cpu_optimizer::StateBytesPerElement(
        cpu_optimizer::MomentCount(config.optimizer->type), moment_bytes));
  }
  if (config.train_micro_batch_size_per_gpu > 0) {
    out.micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  }
  return out;
}

PlanInput PlanInputFor(const ModelSpec& spec, const PlanSettings& settings, int micro_batch,
                       int compute_bytes, int world, int rank) {
  PlanInput in;
  if (spec.gpt) {
    in = GptPlanInput(*spec.gpt, micro_batch, compute_bytes, settings.sub_group_size,
                      settings.persistence_threshold);
  } else {
    in = LlamaPlanInput(*spec.llama, micro_batch, spec.seq_len, compute_bytes,
                        settings.sub_group_size, settings.persistence_threshold);
  }
  in.layout = RankLayout(in.layout, settings.sub_group_size, world, rank);
  ApplyPlanSettings(settings, &in);
  return in;
}

void ApplyPlanSettings(const PlanSettings& settings, PlanInput* in) {
  in->param_buffer_count = settings.param_buffer_count;
  in->param_buffer_size = settings.param_buffer_size;
  in->max_in_cpu = settings.max_in_cpu;
  in->optimizer_buffer_count = settings.optimizer_buffer_count;
  in->pipeline = settings.pipeline;
  in->device_prefetch_elements = settings.device_prefetch_elements;
  if (settings.state_bytes) in->state_bytes = *settings.state_bytes;
}

uint64_t LargestLeafParams(const ModelSpec& spec) {
  if (spec.gpt) {
    // The MLP's first Linear (4d² + 4d) or an embedding / the head (vocab·d, seq·d): what
    // DeepSpeed's _all_live measures.
    const GptShape& s = *spec.gpt;
    const uint64_t d = static_cast<uint64_t>(s.d_model);
    return std::max({4 * d * d + 4 * d, static_cast<uint64_t>(s.vocab) * d,
                     static_cast<uint64_t>(s.seq_len) * d});
  }
  const LlamaShape& s = *spec.llama;
  return std::max(static_cast<uint64_t>(s.vocab_size) * static_cast<uint64_t>(s.hidden_size),
                  LlamaLargestLayerTensor(s));
}

uint64_t TotalParams(const ModelSpec& spec) {
  return spec.gpt ? TotalParams(*spec.gpt) : LlamaTotalParams(*spec.llama);
}

}  // namespace strata::runtime
