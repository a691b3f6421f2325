// HfTokenizer: the transformers tokenizer process and its client.
//
// States: Start spawns the helper and reads its one-line hello (facts or an error) -> live; each
// request is written and its reply read under mu_ -> live, or dead once the socket fails (EOF, a
// short read): every later call then returns the same kInternal naming the exit status. The
// destructor closes the socket (the helper's EOF), waits briefly for it, and kills it otherwise.
// Lock rule: mu_ guards the socket and dead_; it is held for one whole request/reply.
#include "runtime/data/hf_tokenizer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/env.h"
#include "runtime/data/hf_tokenizer_helper_source.h"

extern char** environ;

namespace strata::runtime {
namespace {

// How long the helper may take to import transformers and load the tokenizer (a cold disk and a
// large tokenizer.json take seconds; a hung import must not hang strata).
constexpr int kStartTimeoutMs = 180'000;

Status WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return IoErrorFromErrno(errno, "writing to the tokenizer process");
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Reads exactly n bytes; false on EOF or an error (the process is gone).
bool ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The hello line, waiting at most kStartTimeoutMs in all.
Result<std::string> ReadHello(int fd, const std::string& python) {
  std::string line;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kStartTimeoutMs);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return UnavailableError(python + " did not start strata's tokenizer process within " +
                              std::to_string(kStartTimeoutMs / 1000) + " s");
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char c;
    const ssize_t r = ::recv(fd, &c, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return UnavailableError(python + " exited before strata's tokenizer started");
    if (c == '\n') return line;
    line.push_back(c);
    if (line.size() > (1 << 20)) return InternalError(python + ": tokenizer hello too long");
  }
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

// Ends the process: EOF first, then SIGKILL if it is still there after `grace`.
void Reap(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

struct Spawned {
  pid_t pid = -1;
  int fd = -1;
};

Result<Spawned> Spawn(const std::string& python, const std::string& model_dir) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return IoErrorFromErrno(errno, "socketpair for the tokenizer process");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: the terminal's Ctrl-C is strata's
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  const std::string source(HfTokenizerHelperSource());
  std::vector<char*> argv = {const_cast<char*>(python.c_str()), const_cast<char*>("-c"),
                             const_cast<char*>(source.c_str()),
                             const_cast<char*>(model_dir.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = python.find('/') == std::string::npos
                     ? ::posix_spawnp(&pid, python.c_str(), &actions, &attr, argv.data(), environ)
                     : ::posix_spawn(&pid, python.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return UnavailableError("cannot run " + python + ": " + std::strerror(rc));
  }
  return Spawned{pid, fds[0]};
}

// The interpreters to try, in order (hf_tokenizer.h).
std::vector<std::string> Candidates() {
  const char* env = GetEnv("STRATA_PYTHON");
  if (env != nullptr && env[0] != '\0') return {env};
  std::vector<std::string> out;
  std::error_code ec;
#ifdef STRATA_DEFAULT_PYTHON
  if (std::filesystem::exists(STRATA_DEFAULT_PYTHON, ec)) out.push_back(STRATA_DEFAULT_PYTHON);
#endif
  out.push_back("python3");
  return out;
}

}  // namespace

std::string_view HfTokenizerHelperSource() { return kHfTokenizerHelperSource; }

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Start(const std::string& model_dir) {
  std::string tried;
  for (const std::string& python : Candidates()) {
    Result<Spawned> spawned = Spawn(python, model_dir);
    if (!spawned.ok()) {
      tried += "\n  " + std::string(spawned.status().message());
      continue;
    }
    Result<std::string> hello = ReadHello(spawned->fd, python);
    nlohmann::json facts;
    if (hello.ok()) facts = nlohmann::json::parse(*hello, nullptr, /*allow_exceptions=*/false);
    if (!hello.ok() || !facts.is_object()) {
      ::close(spawned->fd);
      Reap(spawned->pid, std::chrono::milliseconds(0));
      tried += "\n  " + (hello.ok() ? python + ": not strata's tokenizer hello: " + *hello
                                    : std::string(hello.status().message()));
      continue;
    }
    if (facts.contains("error")) {
      ::close(spawned->fd);
      Reap(spawned->pid, std::chrono::milliseconds(2000));
      const std::string error =
          facts["error"].is_string() ? facts["error"].get<std::string>() : facts["error"].dump();
      if (error.find("is not installed") != std::string::npos) {
        tried += "\n  " + error;
        continue;  // another interpreter may have the packages
      }
      return InvalidArgumentError(error);
    }
    std::unique_ptr<HfTokenizer> t(new HfTokenizer());
    t->fd_ = spawned->fd;
    t->pid_ = spawned->pid;
    t->model_dir_ = model_dir;
    HfTokenizerFacts& f = t->facts_;
    f.python = python;
    f.tokenizer_class = facts.value("class", "");
    f.versions = "transformers " + facts.value("transformers", "?") + ", tokenizers " +
                 facts.value("tokenizers", "?");
    f.vocab_size = facts.value("vocab_size", 0);
    f.bos_id = facts.value("bos_id", -1);
    f.eos_id = facts.value("eos_id", -1);
    f.pad_id = facts.value("pad_id", -1);
    f.add_bos = facts.value("add_bos", false);
    f.add_eos = facts.value("add_eos", false);
    f.chat_template = facts.value("chat_template", false);
    f.generation_tags = facts.value("generation_tags", false);
    return t;
  }
  return UnavailableError(model_dir +
                          ": no Python to run its Hugging Face tokenizer (strata tokenizes text "
                          "with transformers and tokenizers: pip install transformers tokenizers, "
                          "or set STRATA_PYTHON to a python that has them). Tried:" +
                          tried);
}

HfTokenizer::~HfTokenizer() {
  if (fd_ >= 0) ::close(fd_);
  Reap(pid_, std::chrono::milliseconds(2000));
}

Status HfTokenizer::Died(const std::string& what) const {
  dead_ = true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  const std::string how = r == pid_ ? ExitText(status) : "stopped answering";
  return InternalError("the tokenizer process of " + model_dir_ + " (" + facts_.python + ") " +
                       how + " " + what);
}

Result<std::string> HfTokenizer::Call(char op, std::string_view payload) const {
  if (dead_) return Died("earlier");
  if (payload.size() > 0xffffffffu) return InvalidArgumentError("a record over 4 GiB");
  char head[5];
  head[0] = op;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::memcpy(head + 1, &n, 4);
  if (!WriteAll(fd_, head, 5).ok() || !WriteAll(fd_, payload.data(), payload.size()).ok()) {
    return Died("while strata sent it a request");
  }
  char reply[5];
  if (!ReadAll(fd_, reply, 5)) return Died("while strata waited for its answer");
  uint32_t len;
  std::memcpy(&len, reply + 1, 4);
  std::string out(len, '\0');
  if (!ReadAll(fd_, out.data(), len)) return Died("while strata read its answer");
  if (reply[0] != 0) return InvalidArgumentError(out);
  return out;
}

Status HfTokenizer::EncodeAppend(std::string_view text, std::vector<int32_t>* ids) const {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_ASSIGN_OR_RETURN(const std::string bytes, Call('E', text));
  const size_t n = bytes.size() / 4;
  const size_t before = ids->size();
  ids->resize(before + n);
  std::memcpy(ids->data() + before, bytes.data(), n * 4);
  return Status::Ok();
}

Result<std::string> HfTokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::vector<int32_t> narrow;
  narrow.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id >= 0 && id < facts_.vocab_size) narrow.push_back(static_cast<int32_t>(id));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Call('D',
              std::string_view(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 4));
}

Result<ChatTokens> HfTokenizer::EncodeChat(std::string_view messages_json) const {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_ASSIGN_OR_RETURN(const std::string bytes, Call('C', messages_json));
  uint32_t n = 0;
  if (bytes.size() < 4) return InternalError("tokenizer process: short chat reply");
  std::memcpy(&n, bytes.data(), 4);
  if (bytes.size() != 4 + static_cast<size_t>(n) * 5) {
    return InternalError("tokenizer process: malformed chat reply");
  }
  ChatTokens out;
  out.ids.resize(n);
  std::memcpy(out.ids.data(), bytes.data() + 4, static_cast<size_t>(n) * 4);
  out.assistant.assign(bytes.begin() + 4 + static_cast<size_t>(n) * 4, bytes.end());
  return out;
}

}  // namespace strata::runtime
