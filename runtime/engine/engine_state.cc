// Engine state on disk: checkpoints (SaveState/LoadState) and the consolidated safetensors export.
// Format "strata-engine" version 1: engine.json (mode, optimizer, steps, compute dtype, fp16's loss
// scaler state and skipped steps (absent in older files: none skipped), the layout: groups with
// their parameters' names and shapes and their sub-groups), then one entry per group's flat
// parameters and per sub-group's state block (offload), or per parameter plus torch::optim's
// archive (no offload). With data-parallel ranks (world_size > 1 in engine.json) each rank writes
// its own pieces into the same checkpoint: its parameter slice "params/<group>/<begin>.bin" and
// its sub-groups' state blocks; engine.json (rank 0's) lists every rank's pieces ("param_pieces",
// "subgroups": [begin, numel] in order, tiling the group). Loading reads whatever range this
// engine's rank owns from the pieces that hold it, so a checkpoint of N ranks loads into M ranks
// (and into any sub_group_size); each parameter is found by name in whichever group held it, so it
// also loads into another grouping of the same parameters (offload units of their own per expert,
// --page-experts, or whole decoder layers). Every block is streamed from whatever tier holds it,
// NVMe included, so host memory never holds more than one block. Runs on the training thread
// between steps.
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/json_values.h"
#include "cpu_optimizer/convert.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/engine/torch_optimizer.h"
#include "runtime/persist/safetensors.h"

namespace strata::runtime {
namespace {

// A no-offload parameter's fp32 value: torch::optim's master where it keeps one, else the
// parameter itself (an inference engine has no optimizer).
torch::Tensor Fp32ValueOf(TorchOptimizer* optimizer, const torch::Tensor& param) {
  return optimizer != nullptr ? optimizer->Fp32Value(param) : param;
}

}  // namespace

nlohmann::json Engine::LayoutJson() const {
  nlohmann::json j;
  j["format"] = "strata-engine";
  j["version"] = 1;
  j["mode"] = impl_ ? "offload" : "none";
  j["optimizer"] = std::string(cpu_optimizer::OptimizerTypeName(options_.optimizer_options.type));
  j["global_steps"] = global_steps_;
  j["compute_dtype"] = DTypeName(options_.precision);
  j["moment_dtype"] = DTypeName(options_.moment_dtype);
  j["micro_steps"] = micro_steps_;
  j["skipped_steps"] = skipped_steps_;
  if (scaler_) {
    const LossScaler::State st = scaler_->state();
    j["loss_scaler"] = {{"scale", st.scale},
                        {"iteration", st.iteration},
                        {"last_overflow_iteration", st.last_overflow_iteration},
                        {"hysteresis_left", st.hysteresis_left}};
  }
  if (impl_) {
    const EngineLayout& l = impl_->layout;
    // Every rank's sub-groups (state entries) and parameter slices, so that a checkpoint written
    // by any number of ranks describes all of its pieces.
    std::vector<uint64_t> numels;
    for (const ParamGroup& g : l.groups) numels.push_back(g.numel);
    std::vector<std::vector<SubGroupSpan>> per_group(l.groups.size());
    for (int r = 0; r < l.world; ++r) {
      for (const SubGroupSpan& sg : RankSubGroups(numels, options_.sub_group_size, l.world, r)) {
        per_group[sg.group].push_back(sg);
      }
    }
    nlohmann::json groups = nlohmann::json::array();
    for (size_t gi = 0; gi < l.groups.size(); ++gi) {
      const ParamGroup& g = l.groups[gi];
      nlohmann::json gj;
      gj["name"] = g.name;
      gj["numel"] = g.numel;
      nlohmann::json ps = nlohmann::json::array();
      for (const ParamSlot& p : g.params) ps.push_back({{"name", p.name}, {"shape", p.shape}});
      gj["params"] = ps;
      // Per parameter, the applied steps the optimizer skipped it in (no gradient: an expert no
      // token was routed to); absent when none was skipped (and in older files).
      const std::vector<int64_t>& skips = impl_->optimizer->skipped_steps(static_cast<int>(gi));
      if (std::any_of(skips.begin(), skips.end(), [](int64_t n) { return n != 0; })) {
        gj["skipped_steps"] = skips;
      }
      nlohmann::json sgs = nlohmann::json::array();
      for (const SubGroupSpan& sg : per_group[gi]) sgs.push_back({sg.begin, sg.numel});
      gj["subgroups"] = sgs;
      if (l.world > 1) {
        nlohmann::json pieces = nlohmann::json::array();
        for (int r = 0; r < l.world; ++r) {
          const Slice sl = SliceOf(g.numel, l.world, r);
          if (sl.numel > 0) pieces.push_back({sl.begin, sl.numel});
        }
        gj["param_pieces"] = pieces;
      }
      groups.push_back(gj);
    }
    j["groups"] = groups;
    j["world_size"] = l.world;
    j["state_arrays"] = impl_->sizes.state_arrays;
  } else {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad())
        params.push_back({{"name", item.key()}, {"shape", item.value().sizes().vec()}});
    }
    j["params"] = params;
  }
  return j;
}

Status Engine::SaveState(CheckpointWriter& writer) {
  if (options_.inference) {
    return FailedPreconditionError("SaveState: an inference engine has no training state to save");
  }
  if (micro_steps_ % options_.gradient_accumulation_steps != 0) {
    return FailedPreconditionError("SaveState in the middle of gradient accumulation");
  }
  // Ranks write their own pieces into the same checkpoint (runtime/commands/checkpointing.cc
  // commits it once every rank's part is durable); rank 0 writes the description of all of them.
  if (options_.communicator->rank() == 0) {
    STRATA_RETURN_IF_ERROR(writer.WriteJson("engine.json", LayoutJson()));
  }
  if (impl_) return SaveOffloadState(writer);
  if (options_.communicator->rank() != 0) return Status::Ok();  // replicas: rank 0 saves
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    torch::Tensor t = Fp32ValueOf(torch_optim_.get(), item.value())
                          .detach()
                          .to(torch::kCPU, torch::kFloat32)
                          .contiguous();
    STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry("params/" + item.key() + ".bin"));
    STRATA_RETURN_IF_ERROR(e->Append(t.data_ptr(), t.numel() * 4));
    STRATA_RETURN_IF_ERROR(e->Close());
  }
  STRATA_ASSIGN_OR_RETURN(const std::string bytes, torch_optim_->Save());
  STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry("torch_optimizer.bin"));
  STRATA_RETURN_IF_ERROR(e->Append(bytes.data(), bytes.size()));
  return e->Close();
}

Status Engine::SaveOffloadState(CheckpointWriter& writer) {
  Impl& m = *impl_;
  StateStore& store = *m.store;
  STRATA_RETURN_IF_ERROR(m.grads->Drain());
  STRATA_RETURN_IF_ERROR(m.optimizer->Finish());  // the last step's deferred part
  const uint64_t c = m.sizes.compute_bytes;
  std::vector<std::byte> host;
  for (int gi = 0; gi < static_cast<int>(m.layout.groups.size()); ++gi) {
    const ParamGroup& g = m.layout.groups[gi];
    if (g.numel == 0) continue;
    // This rank's parameters: the whole group at world 1 ("params/<group>.bin"), else its slice
    // ("params/<group>/<begin>.bin").
    if (g.own_numel > 0) {
      const std::string pname =
          g.world == 1 ? "params/" + g.name + ".bin"
                       : "params/" + g.name + "/" + std::to_string(g.own_begin) + ".bin";
      STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry(pname));
      const uint64_t bytes = g.own_numel * c;
      if (g.home == Home::kDevice) {
        host.resize(bytes);
        const auto* src =
            static_cast<const std::byte*>(store.group(gi).home_pin.data()) + g.own_begin * c;
        STRATA_RETURN_IF_ERROR(store.device().CopyAsync(host.data(), src, bytes,
                                                        CopyKind::kDeviceToHost, store.d2h()));
        STRATA_RETURN_IF_ERROR(store.device().Synchronize(store.d2h()));
        STRATA_RETURN_IF_ERROR(e->Append(host.data(), bytes));
      } else {
        STRATA_ASSIGN_OR_RETURN(Pin pin, store.tm().Acquire(store.group(gi).block, Tier::kPinned));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        STRATA_RETURN_IF_ERROR(e->Append(pin.data(), bytes));
      }
      STRATA_RETURN_IF_ERROR(e->Close());
    }
    // A state entry is the master, then the moments, whichever block keeps the master.
    Pin masters;
    if (g.master_in_params && !g.subgroups.empty()) {
      STRATA_ASSIGN_OR_RETURN(masters, store.tm().Acquire(store.group(gi).block, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(masters.Wait());
    }
    for (int si : g.subgroups) {
      const SubGroupSpan& sg = m.layout.subgroups[si];
      STRATA_ASSIGN_OR_RETURN(EntryWriter * se, writer.AddEntry("state/" + g.name + "/" +
                                                                std::to_string(sg.begin) + ".bin"));
      STRATA_ASSIGN_OR_RETURN(Pin pin, store.tm().Acquire(store.subgroup(si).state, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      if (g.master_in_params) {
        STRATA_RETURN_IF_ERROR(se->Append(
            static_cast<const float*>(masters.data()) + (sg.begin - g.own_begin), sg.numel * 4));
      }
      STRATA_RETURN_IF_ERROR(
          se->Append(pin.data(), sg.numel * m.sizes.StateElementBytes(g.master_in_params)));
      STRATA_RETURN_IF_ERROR(se->Close());
    }
  }
  return Status::Ok();
}

namespace {

Status Mismatch(const CheckpointReader& reader, const std::string& what) {
  return InvalidArgumentError("checkpoint " + reader.tag() + " does not match this model: " + what);
}

Status ExpectSize(const CheckpointReader& reader, const std::string& name, uint64_t bytes) {
  STRATA_ASSIGN_OR_RETURN(uint64_t size, reader.EntrySize(name));
  if (size != bytes) {
    return Mismatch(reader, name + " has " + std::to_string(size) + " bytes, the model needs " +
                                std::to_string(bytes));
  }
  return Status::Ok();
}

// Name -> shape of every parameter of a layout's "groups" (engine.json).
std::map<std::string, nlohmann::json> ParameterShapes(const nlohmann::json& groups) {
  std::map<std::string, nlohmann::json> out;
  for (const nlohmann::json& g : groups) {
    for (const nlohmann::json& p : g.at("params")) {
      out[p.at("name").get<std::string>()] = p.at("shape");
    }
  }
  return out;
}

// The checkpoint's groups hold exactly this engine's parameters, with their shapes (whatever the
// grouping); else a mismatch naming the first differences.
Status SameParameters(const CheckpointReader& reader, const nlohmann::json& saved,
                      const nlohmann::json& mine) {
  const std::map<std::string, nlohmann::json> a = ParameterShapes(saved), b = ParameterShapes(mine);
  std::vector<std::string> problems;
  for (const auto& [name, shape] : b) {
    auto it = a.find(name);
    if (it == a.end()) {
      problems.push_back(name + " is not in it");
    } else if (it->second != shape) {
      problems.push_back(name + " has shape " + it->second.dump() + " there, " + shape.dump() +
                         " here");
    }
  }
  for (const auto& [name, shape] : a) {
    if (!b.count(name)) problems.push_back(name + " is in it but not in the model");
  }
  if (problems.empty()) return Status::Ok();
  std::string what = std::to_string(problems.size()) + " parameter difference" +
                     (problems.size() == 1 ? "" : "s") + ": ";
  for (size_t i = 0; i < std::min<size_t>(problems.size(), 4); ++i)
    what += (i ? "; " : "") + problems[i];
  if (problems.size() > 4) what += "; ...";
  return Mismatch(reader, what);
}

}  // namespace

Status Engine::LoadState(const CheckpointReader& reader) {
  if (options_.inference) {
    return FailedPreconditionError(
        "LoadState: an inference engine holds no optimizer state to restore a checkpoint into");
  }
  STRATA_RETURN_IF_ERROR(reader.Verify());
  STRATA_ASSIGN_OR_RETURN(nlohmann::json saved, reader.ReadJson("engine.json"));
  const nlohmann::json mine = LayoutJson();
  auto mismatch = [&](const std::string& what) { return Mismatch(reader, what); };
  try {
    if (saved.value("format", "") != "strata-engine" || saved.value("version", 0) != 1)
      return mismatch("engine.json is not a strata engine state (format/version)");
    if (saved.at("mode") != mine.at("mode"))
      return mismatch("saved with offload mode " + saved.at("mode").dump() + ", running " +
                      mine.at("mode").dump());
    if (saved.at("optimizer") != mine.at("optimizer"))
      return mismatch("optimizer " + saved.at("optimizer").dump() + " saved, " +
                      mine.at("optimizer").dump() + " configured");
    // Parameter blocks are in the compute dtype, and only fp16 has a loss scaler: a checkpoint
    // loads into an engine of its own precision only (bf16 and fp16 blocks even have equal sizes).
    const std::string saved_dtype = saved.value("compute_dtype", "fp32");
    if (saved_dtype != mine.at("compute_dtype").get<std::string>())
      return mismatch("saved in " + saved_dtype + ", this engine trains in " +
                      mine.at("compute_dtype").get<std::string>() +
                      " (set fp16/bf16 in the config as when it was saved)");
    const std::string saved_moments = saved.value("moment_dtype", "fp32");
    if (saved_moments != mine.at("moment_dtype").get<std::string>())
      return mismatch("its optimizer moments are " + saved_moments +
                      ", this engine keeps them in " + mine.at("moment_dtype").get<std::string>() +
                      " (set bf16.bf16_optimizer_states as when it was saved)");
    if (impl_) {
      // Offload groups: the checkpoint must hold the same parameters (names and shapes); how it
      // grouped them (its offload units: --page-experts on one side only, another persistence
      // threshold), cut them into sub-groups and rank slices is read from it (LoadOffloadState
      // reads every parameter by name), so any partition and any world size loads.
      STRATA_RETURN_IF_ERROR(SameParameters(reader, saved.at("groups"), mine.at("groups")));
    } else {
      const auto& a = saved.at("params");
      const auto& b = mine.at("params");
      if (a.size() != b.size())
        return mismatch(std::to_string(a.size()) + " params saved, the model has " +
                        std::to_string(b.size()));
      for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] != b[i]) {
          return mismatch("params[" + std::to_string(i) + "] (" + b[i].value("name", "?") +
                          ") differs: saved " + a[i].dump().substr(0, 300) + ", model " +
                          b[i].dump().substr(0, 300));
        }
      }
    }
    if (impl_ && saved.at("state_arrays") != mine.at("state_arrays"))
      return mismatch("optimizer state layout differs");
    // Counters are read with their ranges checked: a float or huge value (a damaged or
    // hand-edited file) is refused, never cast.
    constexpr int64_t kMaxCounter = int64_t{1} << 62;
    auto counter = [&](const nlohmann::json& j, const char* key) -> Result<int64_t> {
      Result<int64_t> v = JsonInt(j.at(key), key, 0, kMaxCounter);
      if (!v.ok()) return mismatch("engine.json: " + std::string(v.status().message()));
      return v;
    };
    STRATA_ASSIGN_OR_RETURN(global_steps_, counter(saved, "global_steps"));
    STRATA_ASSIGN_OR_RETURN(micro_steps_, counter(saved, "micro_steps"));
    // A checkpoint is taken at an accumulation boundary (SaveState refuses otherwise), and the
    // count only serves to find the next boundary: restart it at one of this run's
    // gradient_accumulation_steps, which may differ from the saved run's (another split of the
    // same global batch into ranks x micro-batch x accumulation resumes exactly).
    if (global_steps_ > kMaxCounter / std::max<int64_t>(1, options_.gradient_accumulation_steps)) {
      return mismatch("engine.json: global_steps " + std::to_string(global_steps_) +
                      " is beyond any run");
    }
    micro_steps_ = global_steps_ * options_.gradient_accumulation_steps;
    skipped_steps_ = 0;
    if (saved.contains("skipped_steps")) {
      STRATA_ASSIGN_OR_RETURN(skipped_steps_, counter(saved, "skipped_steps"));
    }
    last_step_skipped_ = false;
    if (scaler_) {
      const nlohmann::json& ls = saved.at("loss_scaler");
      Result<double> scale = JsonDouble(ls.at("scale"), "loss_scaler.scale", 0, 1e300);
      if (!scale.ok()) return mismatch("engine.json: " + std::string(scale.status().message()));
      STRATA_ASSIGN_OR_RETURN(int64_t iteration, counter(ls, "iteration"));
      STRATA_ASSIGN_OR_RETURN(int64_t last_overflow, counter(ls, "last_overflow_iteration"));
      STRATA_ASSIGN_OR_RETURN(int64_t hysteresis, counter(ls, "hysteresis_left"));
      if (hysteresis > std::numeric_limits<int>::max()) {
        return mismatch("engine.json: loss_scaler.hysteresis_left out of range");
      }
      scaler_->Restore({*scale, iteration, last_overflow, static_cast<int>(hysteresis)});
    }
  } catch (const nlohmann::json::exception& e) {
    return mismatch(std::string("engine.json: ") + e.what());
  }
  torch::NoGradGuard no_grad;
  if (impl_) return LoadOffloadState(reader);
  for (const auto& item : model_->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const std::string name = "params/" + item.key() + ".bin";
    const uint64_t bytes = item.value().numel() * 4;
    STRATA_RETURN_IF_ERROR(ExpectSize(reader, name, bytes));
    torch::Tensor t = torch::empty(item.value().sizes(), torch::kFloat32);
    STRATA_RETURN_IF_ERROR(reader.ReadEntry(name, 0, t.data_ptr(), bytes));
    torch_optim_->Assign(item.value(), t);
  }
  STRATA_ASSIGN_OR_RETURN(uint64_t osize, reader.EntrySize("torch_optimizer.bin"));
  if (osize > 0) {
    std::string bytes(osize, '\0');
    STRATA_RETURN_IF_ERROR(reader.ReadEntry("torch_optimizer.bin", 0, bytes.data(), osize));
    Status s = torch_optim_->Load(bytes, learning_rate());
    if (!s.ok()) return mismatch(std::string(s.message()));
  }
  return Status::Ok();
}

namespace {

// A run of a group's flat range that one checkpoint entry holds.
struct Piece {
  std::string entry;
  uint64_t begin = 0, numel = 0;
};

// The pieces of group `gj` (engine.json) as [begin, numel] pairs at `key`, with their entry names;
// they must tile [0, numel) in order.
Result<std::vector<Piece>> Pieces(const CheckpointReader& reader, const nlohmann::json& list,
                                  uint64_t numel, const std::string& what,
                                  const std::function<std::string(uint64_t)>& entry) {
  std::vector<Piece> out;
  uint64_t next = 0;
  for (const nlohmann::json& p : list) {
    Result<int64_t> b = JsonInt(p.at(0), what, 0, int64_t{1} << 50);
    Result<int64_t> n = JsonInt(p.at(1), what, 1, int64_t{1} << 50);
    if (!b.ok() || !n.ok() || static_cast<uint64_t>(*b) != next) {
      return Mismatch(reader,
                      what + " do not tile the group's " + std::to_string(numel) + " elements");
    }
    out.push_back(
        {entry(static_cast<uint64_t>(*b)), static_cast<uint64_t>(*b), static_cast<uint64_t>(*n)});
    next += static_cast<uint64_t>(*n);
  }
  if (next != numel) {
    return Mismatch(reader, what + " cover " + std::to_string(next) + " of the group's " +
                                std::to_string(numel) + " elements");
  }
  return out;
}

// Reads elements [lo, hi) of array `array` from the pieces into `dst`. Each piece holds its
// arrays back to back, piece.numel elements each, array k's elements `array_bytes[k]` bytes.
Status ReadRange(const CheckpointReader& reader, const std::vector<Piece>& pieces,
                 const std::vector<uint64_t>& array_bytes, size_t array, uint64_t lo, uint64_t hi,
                 std::byte* dst) {
  uint64_t element_bytes = 0, before = 0;  // all arrays' bytes per element; the arrays' before
  for (size_t k = 0; k < array_bytes.size(); ++k) {
    element_bytes += array_bytes[k];
    if (k < array) before += array_bytes[k];
  }
  const uint64_t elem = array_bytes[array];
  for (const Piece& p : pieces) {
    const uint64_t a = std::max(lo, p.begin), b = std::min(hi, p.begin + p.numel);
    if (a >= b) continue;
    STRATA_RETURN_IF_ERROR(ExpectSize(reader, p.entry, p.numel * element_bytes));
    const uint64_t offset = p.numel * before + (a - p.begin) * elem;
    STRATA_RETURN_IF_ERROR(
        reader.ReadEntry(p.entry, offset, dst + (a - lo) * elem, (b - a) * elem));
  }
  return Status::Ok();
}

// A checkpoint's parameter: its group (an index into SavedLayout::groups), its offset there in
// elements, and the applied steps the optimizer skipped it in.
struct SavedParam {
  size_t group = 0;
  uint64_t offset = 0;
  int64_t skipped_steps = 0;
};

// A checkpoint's groups (engine.json) as entries: per group the pieces of its flat parameters and
// of its sub-groups' state, and every parameter by name.
struct SavedLayout {
  struct Group {
    std::vector<Piece> params, states;
  };
  std::vector<Group> groups;
  std::map<std::string, SavedParam> params;
};

Result<SavedLayout> ReadSavedLayout(const CheckpointReader& reader, const nlohmann::json& saved) {
  SavedLayout out;
  std::string name = "?";
  try {
    const nlohmann::json& groups = saved.at("groups");
    for (size_t j = 0; j < groups.size(); ++j) {
      const nlohmann::json& gj = groups.at(j);
      name = gj.at("name").get<std::string>();
      Result<int64_t> numel = JsonInt(gj.at("numel"), "numel", 0, int64_t{1} << 50);
      if (!numel.ok())
        return Mismatch(reader, "engine.json: " + std::string(numel.status().message()));
      const uint64_t n = static_cast<uint64_t>(*numel);
      const nlohmann::json& params = gj.at("params");
      const bool has_skips = gj.contains("skipped_steps");
      if (has_skips &&
          (!gj.at("skipped_steps").is_array() || gj.at("skipped_steps").size() != params.size())) {
        return Mismatch(reader, "engine.json: group " + name +
                                    ": skipped_steps is not one count per "
                                    "parameter");
      }
      uint64_t offset = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        SavedParam p{j, offset, 0};
        if (has_skips) {
          Result<int64_t> k =
              JsonInt(gj.at("skipped_steps").at(i), "skipped_steps", 0, int64_t{1} << 62);
          if (!k.ok()) return Mismatch(reader, "engine.json: " + std::string(k.status().message()));
          p.skipped_steps = *k;
        }
        uint64_t elements = 1;
        for (const nlohmann::json& d : params.at(i).at("shape")) {
          Result<int64_t> dim = JsonInt(d, "shape", 0, int64_t{1} << 50);
          if (!dim.ok())
            return Mismatch(reader, "engine.json: " + std::string(dim.status().message()));
          elements *= static_cast<uint64_t>(*dim);
          if (elements > (uint64_t{1} << 50))
            return Mismatch(reader, "engine.json: a parameter is beyond any model");
        }
        offset += elements;
        if (!out.params.emplace(params.at(i).at("name").get<std::string>(), p).second) {
          return Mismatch(reader, "engine.json: parameter " + params.at(i).at("name").dump() +
                                      " is listed twice");
        }
      }
      if (offset != n) {
        return Mismatch(reader, "engine.json: group " + name + "'s parameters hold " +
                                    std::to_string(offset) + " elements, its numel is " +
                                    std::to_string(n));
      }
      SavedLayout::Group g;
      if (gj.contains("param_pieces")) {
        STRATA_ASSIGN_OR_RETURN(
            g.params,
            Pieces(reader, gj.at("param_pieces"), n, name + "'s parameter pieces", [&](uint64_t b) {
              return "params/" + name + "/" + std::to_string(b) + ".bin";
            }));
      } else {
        g.params.push_back({"params/" + name + ".bin", 0, n});
      }
      STRATA_ASSIGN_OR_RETURN(
          g.states, Pieces(reader, gj.at("subgroups"), n, name + "'s sub-groups", [&](uint64_t b) {
            return "state/" + name + "/" + std::to_string(b) + ".bin";
          }));
      out.groups.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    return Mismatch(reader, "engine.json: group " + name + ": " + e.what());
  }
  return out;
}

// Elements [begin, begin + numel) of this engine's group are elements [source_begin, ...) of the
// checkpoint's group `source`.
struct Segment {
  uint64_t begin = 0, numel = 0;
  size_t source = 0;
  uint64_t source_begin = 0;
};

// ReadRange for elements [lo, hi) of this engine's group whose parameters `segments` place in the
// checkpoint's groups: its parameters (state false) or its state entries' array `array`.
Status ReadMapped(const CheckpointReader& reader, const SavedLayout& saved,
                  const std::vector<Segment>& segments, bool state,
                  const std::vector<uint64_t>& array_bytes, size_t array, uint64_t lo, uint64_t hi,
                  std::byte* dst) {
  const uint64_t elem = array_bytes[array];
  for (const Segment& s : segments) {
    const uint64_t a = std::max(lo, s.begin), b = std::min(hi, s.begin + s.numel);
    if (a >= b) continue;
    const SavedLayout::Group& g = saved.groups[s.source];
    const uint64_t from = s.source_begin + (a - s.begin);
    STRATA_RETURN_IF_ERROR(ReadRange(reader, state ? g.states : g.params, array_bytes, array, from,
                                     from + (b - a), dst + (a - lo) * elem));
  }
  return Status::Ok();
}

}  // namespace

Status Engine::LoadOffloadState(const CheckpointReader& reader) {
  Impl& m = *impl_;
  StateStore& store = *m.store;
  TierManager& tm = store.tm();
  STRATA_RETURN_IF_ERROR(m.grads->Drain());
  STRATA_RETURN_IF_ERROR(m.optimizer->Finish());  // nothing may still write what is loaded
  STRATA_ASSIGN_OR_RETURN(nlohmann::json saved, reader.ReadJson("engine.json"));
  STRATA_ASSIGN_OR_RETURN(const SavedLayout from, ReadSavedLayout(reader, saved));
  // A state entry's arrays: the fp32 master, then the moments.
  std::vector<uint64_t> state_arrays(m.sizes.state_arrays, m.sizes.moment_bytes);
  state_arrays[0] = 4;
  const uint64_t c = m.sizes.compute_bytes;
  for (int gi = 0; gi < static_cast<int>(m.layout.groups.size()); ++gi) {
    const ParamGroup& g = m.layout.groups[gi];
    if (g.numel == 0) continue;
    // Where each of this group's parameters is in the checkpoint (LoadState checked that every
    // one is there with its shape), and its skipped steps.
    std::vector<Segment> segments;
    std::vector<int64_t> skips;
    for (const ParamSlot& p : g.params) {
      auto it = from.params.find(p.name);
      if (it == from.params.end()) return Mismatch(reader, p.name + " is not in it");
      const SavedParam& sp = it->second;
      skips.push_back(sp.skipped_steps);
      Segment* last = segments.empty() ? nullptr : &segments.back();
      if (last != nullptr && last->source == sp.group && last->begin + last->numel == p.offset &&
          last->source_begin + last->numel == sp.offset) {
        last->numel += p.numel;  // contiguous there too: one read
      } else {
        segments.push_back({p.offset, p.numel, sp.group, sp.offset});
      }
    }
    m.optimizer->set_skipped_steps(gi, std::move(skips));
    auto read = [&](bool state, const std::vector<uint64_t>& array_bytes, size_t array, uint64_t lo,
                    uint64_t hi, std::byte* dst) {
      return ReadMapped(reader, from, segments, state, array_bytes, array, lo, hi, dst);
    };
    // Parameters: device homes hold the whole group, offloaded ones this rank's slice.
    if (g.home == Home::kDevice) {
      std::vector<std::byte> host(g.gathered() * c);
      STRATA_RETURN_IF_ERROR(read(false, {c}, 0, 0, g.numel, host.data()));
      STRATA_RETURN_IF_ERROR(store.device().CopyAsync(store.group(gi).home_pin.data(), host.data(),
                                                      host.size(), CopyKind::kHostToDevice,
                                                      store.h2d()));
      STRATA_RETURN_IF_ERROR(store.device().Synchronize(store.h2d()));
    }
    // Offloaded parameters stay pinned until their masters (master_in_params) are read too.
    Pin param_pin;
    if (g.home != Home::kDevice) {
      STRATA_ASSIGN_OR_RETURN(param_pin, tm.Acquire(store.group(gi).block, Tier::kPinned,
                                                    TierManager::Access::kOverwrite));
      STRATA_RETURN_IF_ERROR(param_pin.Wait());
      auto* dst = static_cast<std::byte*>(param_pin.data());
      std::memset(dst, 0, g.part * c);
      STRATA_RETURN_IF_ERROR(read(false, {c}, 0, g.own_begin, g.own_begin + g.own_numel, dst));
      param_pin.MarkDirty();
    }
    for (int si : g.subgroups) {
      const SubGroupSpan& sg = m.layout.subgroups[si];
      const BlockId state = store.subgroup(si).state;
      STRATA_ASSIGN_OR_RETURN(Pin pin,
                              tm.Acquire(state, Tier::kPinned, TierManager::Access::kOverwrite));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      // The master, then the moments; the saved master goes to the parameter block when that
      // is the master (equal to the saved parameters in fp32; the master is what the optimizer
      // saved).
      std::byte* to = g.master_in_params
                          ? static_cast<std::byte*>(param_pin.data()) + (sg.begin - g.own_begin) * 4
                          : static_cast<std::byte*>(pin.data());
      for (size_t a = 0; a < state_arrays.size(); ++a) {
        STRATA_RETURN_IF_ERROR(read(true, state_arrays, a, sg.begin, sg.begin + sg.numel, to));
        to = (a == 0 && g.master_in_params) ? static_cast<std::byte*>(pin.data())
                                            : to + sg.numel * state_arrays[a];
      }
      pin.MarkDirty();
      if (options_.optimizer == Home::kNvme) {
        pin.Release();
        STRATA_RETURN_IF_ERROR(tm.Flush(state));
      }
      m.grads->Reset(si);
    }
    if (g.home == Home::kNvme) {
      param_pin.Release();
      STRATA_RETURN_IF_ERROR(tm.Flush(store.group(gi).block));
    }
  }
  store.RefreshDeviceHomeTensors();
  m.coordinator->Invalidate();  // re-record after a restore
  return Status::Ok();
}

Status Engine::GroupMasters(int gi, std::vector<float>& whole) {
  Impl& m = *impl_;
  if (m.optimizer) STRATA_RETURN_IF_ERROR(m.optimizer->Finish());  // the last step's deferred part
  const ParamGroup& g = m.layout.groups[gi];
  // This rank's masters at their place in the group, then (ranks) every rank's slice.
  whole.assign(g.gathered(), 0.0f);
  if (options_.inference) {  // no masters: the parameter block, widened to fp32
    if (g.own_numel > 0) {
      STRATA_ASSIGN_OR_RETURN(Pin pin,
                              m.store->tm().Acquire(m.store->group(gi).block, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      float* out = whole.data() + g.own_begin;
      const auto* half = static_cast<const uint16_t*>(pin.data());
      switch (options_.precision) {
        case DType::kFloat32:
          std::memcpy(out, pin.data(), g.own_numel * 4);
          break;
        case DType::kBFloat16:
          for (uint64_t i = 0; i < g.own_numel; ++i) out[i] = cpu_optimizer::Bf16ToFloat(half[i]);
          break;
        case DType::kFloat16:
          for (uint64_t i = 0; i < g.own_numel; ++i) out[i] = cpu_optimizer::HalfToFloat(half[i]);
          break;
      }
    }
  } else if (g.master_in_params) {  // the parameter block is this rank's masters
    if (g.own_numel > 0) {
      STRATA_ASSIGN_OR_RETURN(Pin pin,
                              m.store->tm().Acquire(m.store->group(gi).block, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      std::memcpy(whole.data() + g.own_begin, pin.data(), g.own_numel * 4);
    }
  } else {
    for (int si : g.subgroups) {
      const SubGroupSpan& sg = m.layout.subgroups[si];
      STRATA_ASSIGN_OR_RETURN(Pin pin,
                              m.store->tm().Acquire(m.store->subgroup(si).state, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      std::memcpy(whole.data() + sg.begin, pin.data(), sg.numel * 4);
    }
  }
  if (g.world == 1) return Status::Ok();
  float* mine = whole.data() + static_cast<uint64_t>(m.layout.rank) * g.part;
  return options_.communicator->AllGather(mine, whole.data(), g.part * 4);
}

Status Engine::ExportSafetensors(const std::string& path,
                                 const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  if (!impl_) {
    if (options_.communicator->rank() != 0) return Status::Ok();  // replicas: rank 0 writes
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad())
        specs.push_back({item.key(), "F32", item.value().sizes().vec()});
    }
    STRATA_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, specs, metadata));
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      torch::Tensor t = Fp32ValueOf(torch_optim_.get(), item.value())
                            .detach()
                            .to(torch::kCPU, torch::kFloat32)
                            .contiguous();
      STRATA_RETURN_IF_ERROR(w->Append(t.data_ptr(), t.numel() * 4));
    }
    return w->Finish();
  }
  Impl& m = *impl_;
  for (const ParamGroup& g : m.layout.groups) {
    for (const ParamSlot& p : g.params) specs.push_back({p.name, "F32", p.shape});
  }
  if (m.layout.world == 1 && !options_.inference) {
    STRATA_RETURN_IF_ERROR(m.optimizer->Finish());  // the last step's deferred part
    STRATA_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, specs, metadata));
    // The fp32 master weights (equal to the parameters in fp32 training), sub-group by
    // sub-group: host memory holds one block.
    for (size_t gi = 0; gi < m.layout.groups.size(); ++gi) {
      const ParamGroup& g = m.layout.groups[gi];
      if (g.master_in_params && g.numel > 0) {
        STRATA_ASSIGN_OR_RETURN(
            Pin pin,
            m.store->tm().Acquire(m.store->group(static_cast<int>(gi)).block, Tier::kPinned));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        STRATA_RETURN_IF_ERROR(w->Append(pin.data(), g.numel * 4));
        continue;
      }
      for (int si : g.subgroups) {
        STRATA_ASSIGN_OR_RETURN(Pin pin,
                                m.store->tm().Acquire(m.store->subgroup(si).state, Tier::kPinned));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        STRATA_RETURN_IF_ERROR(w->Append(pin.data(), m.layout.subgroups[si].numel * 4));
      }
    }
    return w->Finish();
  }
  // Ranks: every rank gathers each group's masters and rank 0 writes them (the same file whatever
  // the world size). Rank 0 keeps gathering after a write error, so the others are not left
  // waiting, and returns it at the end.
  std::unique_ptr<SafetensorsWriter> w;
  Status failed;
  if (options_.communicator->rank() == 0) {
    Result<std::unique_ptr<SafetensorsWriter>> created =
        SafetensorsWriter::Create(path, specs, metadata);
    failed = created.status();
    if (created.ok()) w = std::move(*created);
  }
  std::vector<float> whole;
  for (int gi = 0; gi < static_cast<int>(m.layout.groups.size()); ++gi) {
    const ParamGroup& g = m.layout.groups[gi];
    if (g.numel == 0) continue;
    STRATA_RETURN_IF_ERROR(GroupMasters(gi, whole));
    if (w != nullptr && failed.ok()) failed = w->Append(whole.data(), g.numel * 4);
  }
  if (w != nullptr && failed.ok()) failed = w->Finish();
  return failed;
}

std::vector<std::pair<int, int>> Engine::ModelOrderSlots() const {
  std::map<std::string, std::pair<int, int>> where;  // name -> (group, slot)
  const EngineLayout& l = impl_->layout;
  for (int gi = 0; gi < static_cast<int>(l.groups.size()); ++gi) {
    for (int si = 0; si < static_cast<int>(l.groups[gi].params.size()); ++si) {
      where[l.groups[gi].params[si].name] = {gi, si};
    }
  }
  std::vector<std::pair<int, int>> out;
  for (const auto& item : model_->named_parameters()) {
    auto it = where.find(item.key());
    if (it != where.end()) out.push_back(it->second);
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Engine::ParameterOrder() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad()) out.emplace_back(item.key(), item.value().sizes().vec());
    }
    return out;
  }
  for (const auto& [gi, si] : ModelOrderSlots()) {
    const ParamSlot& p = impl_->layout.groups[gi].params[si];
    out.emplace_back(p.name, p.shape);
  }
  return out;
}

Status Engine::VisitParameters(const ParameterVisitor& fn) {
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      torch::Tensor t = Fp32ValueOf(torch_optim_.get(), item.value())
                            .detach()
                            .to(torch::kCPU, torch::kFloat32)
                            .contiguous();
      STRATA_RETURN_IF_ERROR(fn(item.key(), t.sizes().vec(), t.data_ptr<float>()));
    }
    return Status::Ok();
  }
  // The model's order, whatever the grouping: the resident group's masters are kept from their
  // first use to the end (the model interleaves them with the units': embeddings first, norms and
  // routers between units, the head last), a unit's until the walk leaves it.
  Impl& m = *impl_;
  std::vector<float> resident, unit;
  bool resident_loaded = false;
  int unit_group = -1;
  Status failed;
  for (const auto& [gi, si] : ModelOrderSlots()) {
    std::vector<float>* values = &unit;
    if (gi == m.layout.resident_group) {
      if (!resident_loaded) STRATA_RETURN_IF_ERROR(GroupMasters(gi, resident));
      resident_loaded = true;
      values = &resident;
    } else if (gi != unit_group) {
      STRATA_RETURN_IF_ERROR(GroupMasters(gi, unit));
      unit_group = gi;
    }
    // With ranks every group is gathered even after `fn` failed: the other ranks are gathering.
    if (!failed.ok()) continue;
    const ParamSlot& p = m.layout.groups[gi].params[si];
    failed = fn(p.name, p.shape, values->data() + p.offset);
    if (!failed.ok() && m.layout.world == 1) return failed;
  }
  return failed;
}

Result<std::vector<std::pair<std::string, torch::Tensor>>> Engine::ParameterValues() {
  std::map<std::string, torch::Tensor> values;
  STRATA_RETURN_IF_ERROR(VisitParameters(
      [&](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
        values[name] = torch::from_blob(const_cast<float*>(data), shape, torch::kFloat32).clone();
        return Status::Ok();
      }));
  std::vector<std::pair<std::string, torch::Tensor>> out;  // in the model's order
  for (const auto& item : model_->named_parameters()) {
    auto it = values.find(item.key());
    if (it != values.end()) out.emplace_back(item.key(), std::move(it->second));
  }
  return out;
}

}  // namespace strata::runtime
