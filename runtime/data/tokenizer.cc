// Tokenizer: SentencePiece's processor (through the shim, sentencepiece_shim.h) plus the two
// settings of tokenizer_config.json that decide what a slow Hugging Face tokenizer adds around each
// record (add_bos_token, add_eos_token), and the special tokens' ids as transformers resolves them:
// the piece of that name in the model, else an entry of "added_tokens_decoder".
#include "runtime/data/tokenizer.h"

#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "base/env.h"
#include "base/json_text.h"
#include "runtime/data/hf_tokenizer.h"
#include "runtime/data/sentencepiece_shim.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STRATA_INTERNAL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STRATA_INTERNAL_SANITIZED 1
#endif
#endif

namespace strata::runtime {
namespace {

using nlohmann::json;

#ifdef STRATA_INTERNAL_SANITIZED
// Whether a libprotobuf other than SentencePiece's own copy is in the global symbol scope.
bool SystemProtobufLoaded() {
  void* sym = ::dlsym(RTLD_DEFAULT, "_ZN6google8protobuf8internal13VerifyVersionEiiPKc");
  Dl_info info{};
  return sym != nullptr && ::dladdr(sym, &info) != 0 && info.dli_fname != nullptr &&
         std::string_view(info.dli_fname).find("libprotobuf") != std::string_view::npos;
}
#endif

// The directory of the executable or shared object that holds this code (strata's libraries are
// static: a program, or a Python extension module that links them); empty when unknown.
std::filesystem::path LoaderDirectory() {
  Dl_info info{};
  struct link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(&LoaderDirectory), &info, reinterpret_cast<void**>(&map),
                RTLD_DL_LINKMAP) == 0) {
    return {};
  }
  if (map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
    return std::filesystem::path(map->l_name).parent_path();
  }
  // The main program has no name of its own here (dladdr would give argv[0], perhaps a bare name
  // found on PATH): the kernel's link to it.
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : exe.parent_path();
}

// The directories the dynamic linker searches for a library that the object holding this code
// loads: its RUNPATH, LD_LIBRARY_PATH, the system's. dlopen of a bare name does this search
// itself, but under the sanitizers dlopen is intercepted and searches as their runtime library,
// which has no RUNPATH: the program's is asked for here and tried by full path.
std::vector<std::string> LibrarySearchPath() {
  Dl_info info{};
  struct link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(&LibrarySearchPath), &info, reinterpret_cast<void**>(&map),
                RTLD_DL_LINKMAP) == 0 ||
      map == nullptr) {
    return {};
  }
  Dl_serinfo size{};
  if (::dlinfo(map, RTLD_DI_SERINFOSIZE, &size) != 0 || size.dls_size < sizeof(Dl_serinfo)) {
    return {};
  }
  std::vector<std::max_align_t> buffer(size.dls_size / sizeof(std::max_align_t) + 1);
  auto* serinfo = reinterpret_cast<Dl_serinfo*>(buffer.data());
  *serinfo = size;  // dls_size and dls_cnt, as RTLD_DI_SERINFO requires
  if (::dlinfo(map, RTLD_DI_SERINFO, serinfo) != 0) return {};
  std::vector<std::string> dirs;
  for (unsigned i = 0; i < serinfo->dls_cnt; ++i) {
    if (serinfo->dls_serpath[i].dls_name != nullptr)
      dirs.push_back(serinfo->dls_serpath[i].dls_name);
  }
  return dirs;
}

// Loads the shim (once per process; never unloaded). Note [SentencePiece is loaded apart].
// Where: STRATA_SENTENCEPIECE_SHIM when set, else next to the loading program or library, then in
// STRATA_SENTENCEPIECE_RELDIR from it (an installed bin/strata: ../lib/strata), then by file name
// on its library path (its RUNPATH: the build tree's programs, and programs built against an
// installed strata, have the module's directory there; LD_LIBRARY_PATH).
Result<const StrataSentencePieceApi*> OpenShim() {
  int flags = RTLD_NOW | RTLD_LOCAL;
#ifdef STRATA_INTERNAL_SANITIZED
  // The sanitizer runtimes refuse RTLD_DEEPBIND; without it SentencePiece would bind to the
  // system libprotobuf when one is loaded.
  if (SystemProtobufLoaded()) {
    return UnavailableError(
        "SentencePiece cannot run in a sanitizer build of a program that loads libprotobuf "
        "(libtorch does): it needs dlopen's RTLD_DEEPBIND, which the sanitizers refuse");
  }
#else
  flags |= RTLD_DEEPBIND;
#endif
  const std::string file = STRATA_SENTENCEPIECE_FILE;
  std::vector<std::string> candidates;
  const char* env = GetEnv("STRATA_SENTENCEPIECE_SHIM");
  if (env != nullptr && env[0] != '\0') {
    candidates.push_back(env);
  } else {
    const std::filesystem::path dir = LoaderDirectory();
    if (!dir.empty()) {
      candidates.push_back((dir / file).string());
      candidates.push_back((dir / STRATA_SENTENCEPIECE_RELDIR / file).lexically_normal().string());
    }
    for (const std::string& dir : LibrarySearchPath()) {  // only where it is (tens of dirs)
      std::error_code error;
      const std::filesystem::path path = std::filesystem::path(dir) / file;
      if (!dir.empty() && std::filesystem::exists(path, error)) candidates.push_back(path.string());
    }
    candidates.push_back(file);  // no slash: dlopen searches the library path
  }
  std::string tried;
  for (const std::string& path : candidates) {
    void* handle = ::dlopen(path.c_str(), flags);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += "\n  " + path +
               (path.find('/') == std::string::npos
                    ? " on the program's library path (RUNPATH, LD_LIBRARY_PATH)"
                    : "") +
               ": " + (why != nullptr ? why : "unknown error");
      continue;
    }
    auto api_fn = reinterpret_cast<StrataSentencePieceApiFn>(
        ::dlsym(handle, STRATA_SENTENCEPIECE_API_SYMBOL));
    const StrataSentencePieceApi* api = api_fn != nullptr ? api_fn() : nullptr;
    if (api == nullptr || api->version != STRATA_SENTENCEPIECE_API_VERSION) {
      return UnavailableError(path +
                              " is not a strata SentencePiece library of interface version " +
                              std::to_string(STRATA_SENTENCEPIECE_API_VERSION));
    }
    return api;
  }
  return UnavailableError(
      "cannot load " + file +
      " (strata's SentencePiece library, built and installed with strata; the environment "
      "variable STRATA_SENTENCEPIECE_SHIM sets its path). Tried:" +
      tried);
}

Result<const StrataSentencePieceApi*> SentencePieceApi() {
  static const Result<const StrataSentencePieceApi*>* const api =
      new Result<const StrataSentencePieceApi*>(OpenShim());
  return *api;
}

// "add_bos_token"/"add_eos_token": a boolean, or `fallback` when absent or null.
Result<bool> FlagOr(const json& config, const char* key, bool fallback, const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return InvalidArgumentError(path + ": \"" + key + "\" is " + it->dump() +
                                ", expected true or false");
  }
  return it->get<bool>();
}

// The id of the special token `key` ("bos_token"): SentencePiece's own `model_id` when the config
// does not name one, -1 when it names null, else the id of the named token.
Result<int32_t> SpecialId(const StrataSentencePieceApi& api, const void* model, const json& config,
                          const char* key, int32_t model_id, const std::string& path) {
  auto it = config.find(key);
  if (it == config.end()) return model_id;
  if (it->is_null()) return -1;
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();  // an AddedToken: {"content": "<s>", ...}
  } else {
    return InvalidArgumentError(path + ": \"" + key + "\" is " + it->dump() +
                                ", expected a token string or {\"content\": ...}");
  }
  const int32_t id = api.piece_id(model, content.data(), content.size());
  if (id >= 0) return id;
  // An added token, outside the SentencePiece vocabulary.
  auto added = config.find("added_tokens_decoder");
  if (added != config.end() && added->is_object()) {
    for (const auto& [id_text, entry] : added->items()) {
      if (!entry.is_object() || entry.value("content", json()) != content) continue;
      try {
        return static_cast<int32_t>(std::stol(id_text));
      } catch (const std::exception&) {
        break;
      }
    }
  }
  return InvalidArgumentError(path + ": \"" + key + "\" is \"" + content +
                              "\", which is neither a piece of tokenizer.model nor an entry of "
                              "\"added_tokens_decoder\"");
}

}  // namespace

Tokenizer::~Tokenizer() {
  if (model_ != nullptr) api_->free(model_);
}

Result<ChatTokens> Tokenizer::EncodeChat(std::string_view messages_json) const {
  if (hf_ == nullptr) {
    return FailedPreconditionError(model_path_ +
                                   ": chat records need the model's chat template, which only "
                                   "the transformers tokenizer renders (Open with need_chat)");
  }
  return hf_->EncodeChat(messages_json);
}

std::string Tokenizer::backend() const {
  if (hf_ == nullptr) return "sentencepiece";
  return hf_->facts().versions + " (" + hf_->facts().tokenizer_class + ")";
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Open(const std::string& model_dir, bool need_chat) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return NotFoundError("model directory " + model_dir + " does not exist");
  }
  const bool has_json = fs::is_regular_file(fs::path(model_dir) / "tokenizer.json", ec);
  const bool has_model = fs::is_regular_file(fs::path(model_dir) / "tokenizer.model", ec);
  const char* env = GetEnv("STRATA_TOKENIZER");
  const std::string want = env != nullptr && env[0] != '\0' ? env : "auto";
  if (want != "auto" && want != "transformers" && want != "sentencepiece") {
    return InvalidArgumentError("STRATA_TOKENIZER is \"" + want +
                                "\", expected auto, transformers or sentencepiece");
  }
  if (!has_json && !has_model) {
    return NotFoundError(model_dir +
                         " has no tokenizer (neither tokenizer.json nor tokenizer.model)");
  }
  const bool sentencepiece =
      !need_chat && has_model && (want == "sentencepiece" || (want == "auto" && !has_json));
  return sentencepiece ? OpenSentencePiece(model_dir) : OpenTransformers(model_dir);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::OpenTransformers(const std::string& model_dir) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> hf, HfTokenizer::Start(model_dir));
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const HfTokenizerFacts& f = hf->facts();
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path json_path = fs::path(model_dir) / "tokenizer.json";
  t->model_path_ = fs::is_regular_file(json_path, ec) ? json_path.string() : model_dir;
  t->bos_id_ = f.bos_id;
  t->eos_id_ = f.eos_id;
  t->add_bos_ = f.add_bos;
  t->add_eos_ = f.add_eos;
  t->vocab_size_ = f.vocab_size;
  t->hf_ = std::move(hf);
  return t;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::OpenSentencePiece(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string model_path = (fs::path(model_dir) / "tokenizer.model").string();
  STRATA_ASSIGN_OR_RETURN(const StrataSentencePieceApi* api, SentencePieceApi());
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->api_ = api;
  t->model_path_ = model_path;
  char err[512] = "";
  t->model_ = api->load(model_path.c_str(), err, sizeof(err));
  if (t->model_ == nullptr) {
    return InvalidArgumentError(model_path + ": not a SentencePiece model: " + err);
  }
  t->vocab_size_ = api->piece_size(t->model_);

  json config = json::object();
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  if (fs::is_regular_file(config_path, ec)) {
    STRATA_ASSIGN_OR_RETURN(config, ReadJsonFile(config_path));
    if (!config.is_object()) {
      return InvalidArgumentError(config_path + ": expected a JSON object");
    }
  }
  STRATA_ASSIGN_OR_RETURN(t->bos_id_, SpecialId(*api, t->model_, config, "bos_token",
                                                api->bos_id(t->model_), config_path));
  STRATA_ASSIGN_OR_RETURN(t->eos_id_, SpecialId(*api, t->model_, config, "eos_token",
                                                api->eos_id(t->model_), config_path));
  STRATA_ASSIGN_OR_RETURN(const bool add_bos, FlagOr(config, "add_bos_token", true, config_path));
  STRATA_ASSIGN_OR_RETURN(const bool add_eos, FlagOr(config, "add_eos_token", false, config_path));
  t->add_bos_ = add_bos && t->bos_id_ >= 0;
  t->add_eos_ = add_eos && t->eos_id_ >= 0;
  return t;
}

Status Tokenizer::EncodeAppend(std::string_view text, std::vector<int32_t>* ids) const {
  if (hf_ != nullptr) return hf_->EncodeAppend(text, ids);
  const size_t before = ids->size();
  if (add_bos_) ids->push_back(bos_id_);
  auto sink = [](void* ctx, const int32_t* pieces, size_t n) {
    auto* out = static_cast<std::vector<int32_t>*>(ctx);
    out->insert(out->end(), pieces, pieces + n);
  };
  char err[512] = "";
  if (api_->encode(model_, text.data(), text.size(), sink, ids, err, sizeof(err)) != 0) {
    ids->resize(before);
    return InternalError("SentencePiece " + model_path_ + ": " + err);
  }
  if (add_eos_) ids->push_back(eos_id_);
  return Status::Ok();
}

Result<std::string> Tokenizer::Decode(const std::vector<int64_t>& ids) const {
  if (hf_ != nullptr) return hf_->Decode(ids);
  std::vector<int32_t> pieces;
  for (const int64_t id : ids) {
    if (id >= 0 && id < vocab_size_) pieces.push_back(static_cast<int32_t>(id));
  }
  std::string text;
  auto sink = [](void* ctx, const char* bytes, size_t len) {
    static_cast<std::string*>(ctx)->assign(bytes, len);
  };
  char err[512] = "";
  if (api_->decode(model_, pieces.data(), pieces.size(), sink, &text, err, sizeof(err)) != 0) {
    return InternalError("SentencePiece " + model_path_ + ": " + err);
  }
  return text;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  STRATA_RETURN_IF_ERROR(EncodeAppend(text, &ids));
  return ids;
}

}  // namespace strata::runtime
