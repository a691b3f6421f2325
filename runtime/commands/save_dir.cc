// The --save directory's lock and lineage checks (save_dir.h). Stateless apart from the lock's fd:
// the lock file is opened (created 0644), flocked without blocking, and truncated and refilled with
// this process's pid only once the flock is held, so a refused run never clobbers the owner's pid.
#include "runtime/commands/save_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/persist/checkpoint_store.h"

namespace strata::runtime {
namespace {

// The canonical form of `path` (existing or not), for comparing directories.
std::filesystem::path Canonical(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec) p = std::filesystem::absolute(path).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// True when `inner` is `outer` or below it (both canonical).
bool IsWithin(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

Result<SaveDirLock> SaveDirLock::Acquire(const std::string& root) {
  STRATA_RETURN_IF_ERROR(MakeDirs(root));
  const std::string path = root + "/" + kSaveLockFile;
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDWR | O_CREAT, 0644));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return IoErrorFromErrno(errno, "flock " + path);
    std::string owner;
    char buf[32] = {};
    const ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
    if (n > 0) owner = std::string(buf, static_cast<size_t>(n));
    while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
    return InvalidArgumentError(
        "--save " + root + " is in use by another strata run" +
        (owner.empty() ? "" : " (pid " + owner + ")") +
        ": two runs saving to one directory would overwrite and prune each other's "
        "checkpoints; wait for it to finish or choose another --save directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0) return IoErrorFromErrno(errno, "truncate " + path);
  if (::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return IoErrorFromErrno(errno, "write " + path);
  }
  SaveDirLock lock;
  lock.fd_ = std::move(fd);
  return lock;
}

Result<std::string> NewRunId() {
  try {
    std::random_device rd;  // /dev/urandom or the CPU's generator
    static const char* kHex = "0123456789abcdef";
    std::string id;
    for (int i = 0; i < 4; ++i) {
      uint32_t v = rd();
      for (int k = 0; k < 8; ++k, v >>= 4) id.push_back(kHex[v & 15]);
    }
    return id;
  } catch (const std::exception& e) {
    return InternalError(std::string("no random source for a run id: ") + e.what());
  }
}

Result<std::vector<SavedCheckpoint>> ListSavedCheckpoints(const std::string& root) {
  std::vector<SavedCheckpoint> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return out;
  std::filesystem::directory_iterator it(root, ec);
  if (ec) return IoErrorFromErrno(ec.value(), "list " + root);
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return IoErrorFromErrno(ec.value(), "list " + root);
    const std::string tag = it->path().filename().string();
    if (!IsValidCheckpointTag(tag)) continue;
    struct stat st;
    if (::stat((root + "/" + tag + "/MANIFEST.json").c_str(), &st) != 0) continue;
    SavedCheckpoint c;
    c.tag = tag;
    Result<CheckpointReader> reader = CheckpointReader::Open(root, tag);
    Result<nlohmann::json> t =
        reader.ok() ? reader->ReadJson("trainer.json") : Result<nlohmann::json>(reader.status());
    if (!t.ok() || !t->is_object()) {
      c.readable = false;
    } else {
      if (auto r = t->find("run"); r != t->end() && r->is_string()) c.run = r->get<std::string>();
      // "model" is the model's identity (causal_lm.h): a name, or an object naming it.
      if (auto m = t->find("model"); m != t->end()) {
        if (m->is_string()) {
          c.model = m->get<std::string>();
        } else if (m->is_object() && m->contains("name") && (*m)["name"].is_string()) {
          c.model = (*m)["name"].get<std::string>();
        } else if (m->is_object() && m->contains("architecture") &&
                   (*m)["architecture"].is_string()) {
          c.model = (*m)["architecture"].get<std::string>();
        }
      }
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(),
            [](const SavedCheckpoint& a, const SavedCheckpoint& b) { return a.tag < b.tag; });
  return out;
}

std::string SaveTag(const std::string& root, int64_t step, const std::string& run) {
  const std::string tag = "step-" + std::to_string(step);
  struct stat st;
  if (::stat((root + "/" + tag + "/MANIFEST.json").c_str(), &st) != 0) return tag;
  Result<CheckpointReader> reader = CheckpointReader::Open(root, tag);
  Result<nlohmann::json> t =
      reader.ok() ? reader->ReadJson("trainer.json") : Result<nlohmann::json>(reader.status());
  if (t.ok() && t->is_object() && t->value("run", std::string()) == run) return tag;
  return tag + "-" + (run.empty() ? std::string("legacy") : run.substr(0, 8));
}

Result<std::string> RunIdOfCheckpoint(const CheckpointReader& checkpoint) {
  STRATA_ASSIGN_OR_RETURN(nlohmann::json t, checkpoint.ReadJson("trainer.json"));
  const std::string& where = checkpoint.dir();
  if (!t.is_object()) return DataLossError(where + ": trainer.json is not a JSON object");
  auto r = t.find("run");
  if (r == t.end()) return std::string();
  if (!r->is_string()) {
    return DataLossError(where + ": trainer.json: run: expected a string, got " + r->dump());
  }
  return r->get<std::string>();
}

Status CheckSaveDirOwnership(const std::string& root, const std::string& run, bool resume_in_root,
                             bool overwrite) {
  if (resume_in_root || overwrite) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(std::vector<SavedCheckpoint> saved, ListSavedCheckpoints(root));
  std::string others;
  int n = 0;
  for (const SavedCheckpoint& c : saved) {
    if (c.readable && c.run == run) continue;
    if (n < 4) {
      others += (n ? ", " : "") + c.tag + (c.model.empty() ? "" : " (model " + c.model + ")");
    }
    ++n;
  }
  if (n == 0) return Status::Ok();
  if (n > 4) others += " and " + std::to_string(n - 4) + " more";
  return InvalidArgumentError(
      "--save " + root + " holds " + std::to_string(n) + " checkpoint" + (n == 1 ? "" : "s") +
      " of another run (" + others +
      "); this run would replace its latest and model files: "
      "continue that run with --resume " +
      root +
      ", choose another --save directory, or pass "
      "--overwrite-save to save here anyway (the other run's checkpoints are kept, never pruned)");
}

bool CheckpointIsIn(const std::string& path, const std::string& root) {
  const std::filesystem::path p = Canonical(path);
  const std::filesystem::path r = Canonical(root);
  return p == r || p.parent_path() == r;
}

Status CheckOutsideModelDir(const std::string& out, const std::string& model_dir,
                            const std::string& what, bool allow_inside) {
  if (model_dir.empty() || out.empty()) return Status::Ok();
  const std::filesystem::path o = Canonical(out);
  const std::filesystem::path m = Canonical(model_dir);
  const char* how = o == m           ? "is"
                    : IsWithin(o, m) ? (allow_inside ? nullptr : "is inside")
                    : IsWithin(m, o) ? "contains"
                                     : nullptr;
  if (how == nullptr) return Status::Ok();
  return InvalidArgumentError(what + " " + out + " " + how + " the input model directory " +
                              model_dir +
                              ": writing there would overwrite the weights being "
                              "trained; choose a directory outside it");
}

}  // namespace strata::runtime
