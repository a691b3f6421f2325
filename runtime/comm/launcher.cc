// LaunchLocalRanks (launcher.h): fork + execve per rank, then one poll loop in the calling thread
// that relays the ranks' stderr (a line all ranks write alike, once), forwards signals, reaps the
// ranks and ends the rest after a failure. Between fork and execve a child only makes
// async-signal-safe calls (its argv and environment are built before fork).
#include "runtime/comm/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/signals.h"

extern char** environ;

namespace strata::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Writes all of `s` to `fd`, retrying short writes and EINTR.
void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Lines that every rank writes alike (a config error each rank finds before they meet, a warning
// about the config) are shown once: the k-th occurrence of a text from one rank is dropped when
// another rank's k-th occurrence of it was already shown. The launcher does it rather than the
// ranks (e.g. ranks other than 0 keeping quiet about errors all of them hit) because only it sees
// every rank's lines: a line that one rank alone writes (its own failure) is never lost, and no
// rank has to guess which of its errors the others share. Torchrun's ranks log with their own
// "[rank r] " prefix and are not collapsed.
class SameLineFilter {
 public:
  explicit SameLineFilter(int nproc) : nproc_(nproc) {}
  bool Show(int rank, const std::string& line) {
    if (seen_.size() > 65536) seen_.clear();  // bounded: a long run's distinct lines
    std::vector<int>& count = seen_[line];
    if (count.empty()) count.resize(nproc_);
    const int mine = ++count[rank];
    for (int r = 0; r < nproc_; ++r) {
      if (r != rank && count[r] >= mine) return false;
    }
    return true;
  }

 private:
  const int nproc_;
  std::unordered_map<std::string, std::vector<int>> seen_;  // text -> occurrences per rank
};

struct Rank {
  pid_t pid = -1;
  int err_fd = -1;      // read end of its stderr pipe
  int out_fd = -1;      // read end of its stdout pipe (rank 0, captured)
  std::string partial;  // stderr bytes after the last newline
  bool running = false;
};

}  // namespace

Result<int> FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoErrorFromErrno(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return IoErrorFromErrno(err, "binding a free port on 127.0.0.1");
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<std::vector<std::string>> RemoveNprocFlag(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc") {
      if (i + 1 >= argv.size()) return InvalidArgumentError("--nproc needs a value");
      ++i;
      continue;
    }
    if (argv[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

Result<int> LaunchLocalRanks(int nproc, const std::vector<std::string>& argv,
                             const LaunchOptions& options) {
  if (nproc < 1) return InvalidArgumentError("--nproc " + std::to_string(nproc) + " < 1");
  if (argv.empty()) return InvalidArgumentError("LaunchLocalRanks: empty argv");
  STRATA_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());

  // Everything a child needs, built before fork.
  std::vector<char*> child_argv;
  for (const std::string& a : argv) child_argv.push_back(const_cast<char*>(a.c_str()));
  child_argv.push_back(nullptr);
  static constexpr const char* kOurs[] = {"RANK=",
                                          "WORLD_SIZE=",
                                          "LOCAL_RANK=",
                                          "LOCAL_WORLD_SIZE=",
                                          "MASTER_ADDR=",
                                          "MASTER_PORT=",
                                          "STRATA_LAUNCHER_PREFIXES="};
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool ours = false;
    for (const char* k : kOurs) ours = ours || std::strncmp(*e, k, std::strlen(k)) == 0;
    if (!ours) base_env.push_back(*e);
  }
  std::vector<std::vector<std::string>> envs(nproc, base_env);
  std::vector<std::vector<char*>> envps(nproc);
  for (int r = 0; r < nproc; ++r) {
    const std::string n = std::to_string(nproc), i = std::to_string(r);
    for (std::string kv :
         {"RANK=" + i, "WORLD_SIZE=" + n, "LOCAL_RANK=" + i, "LOCAL_WORLD_SIZE=" + n,
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
          // This launcher prefixes every line of a rank's stderr itself.
          std::string("STRATA_LAUNCHER_PREFIXES=1")}) {
      envs[r].push_back(std::move(kv));
    }
    for (std::string& kv : envs[r]) envps[r].push_back(kv.data());
    envps[r].push_back(nullptr);
  }
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull < 0) return IoErrorFromErrno(errno, "open /dev/null");

  // Forwarding first, so a signal that arrives while ranks start is forwarded too (base/signals.h:
  // the process's one owner of SIGINT/SIGTERM records it for the loop below).
  ForwardScope forward_signals;

  const pid_t parent = ::getpid();
  std::vector<Rank> ranks(nproc);
  Status start_error;
  for (int r = 0; r < nproc && start_error.ok(); ++r) {
    int err_pipe[2], out_pipe[2] = {-1, -1};
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      start_error = IoErrorFromErrno(errno, "pipe");
      break;
    }
    const bool capture = r == 0 && options.rank0_stdout != nullptr;
    if (capture && ::pipe2(out_pipe, O_CLOEXEC) != 0) {
      start_error = IoErrorFromErrno(errno, "pipe");
      ::close(err_pipe[0]);
      ::close(err_pipe[1]);
      break;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGINT, SIG_DFL);   // the child, before execve: not the signal owner's business
      ::signal(SIGTERM, SIG_DFL);  // the child, before execve
      if (capture) {
        ::dup2(out_pipe[1], STDOUT_FILENO);
      } else if (r != 0) {
        ::dup2(devnull, STDOUT_FILENO);
      }
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::execve(options.executable.c_str(), child_argv.data(), envps[r].data());
      const char msg[] = "strata: cannot execute the rank's program\n";
      (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(err_pipe[1]);
    if (capture) ::close(out_pipe[1]);
    if (pid < 0) {
      ::close(err_pipe[0]);
      if (capture) ::close(out_pipe[0]);
      start_error = IoErrorFromErrno(fork_errno, "fork");
      break;
    }
    ranks[r].pid = pid;
    ranks[r].running = true;
    ranks[r].err_fd = err_pipe[0];
    ranks[r].out_fd = capture ? out_pipe[0] : -1;
  }
  ::close(devnull);

  int exit_code = 0;
  bool failed = false;
  if (!start_error.ok()) {
    for (Rank& rk : ranks) {
      if (rk.running) ::kill(rk.pid, SIGTERM);
    }
    failed = true;
  }
  Clock::time_point term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  if (failed) term_at = Clock::now();
  bool termed = false, killed = false;

  SameLineFilter same_lines(nproc);
  const auto flush_line = [&same_lines](int r, const std::string& line) {
    if (!same_lines.Show(r, line)) return;
    WriteAll(STDERR_FILENO, "[rank " + std::to_string(r) + "] " + line + "\n");
  };
  for (;;) {
    // Relay what the ranks wrote.
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;  // (rank, is_stdout)
    for (int r = 0; r < nproc; ++r) {
      if (ranks[r].err_fd >= 0) {
        fds.push_back({ranks[r].err_fd, POLLIN, 0});
        who.push_back({r, false});
      }
      if (ranks[r].out_fd >= 0) {
        fds.push_back({ranks[r].out_fd, POLLIN, 0});
        who.push_back({r, true});
      }
    }
    bool any_running = false;
    for (const Rank& rk : ranks) any_running = any_running || rk.running;
    if (fds.empty() && !any_running) break;
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 100);
    } else {
      ::usleep(100 * 1000);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Rank& rk = ranks[who[i].first];
      char buf[65536];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        ::close(fds[i].fd);
        if (who[i].second) {
          rk.out_fd = -1;
        } else {
          if (!rk.partial.empty()) flush_line(who[i].first, rk.partial);
          rk.partial.clear();
          rk.err_fd = -1;
        }
        continue;
      }
      if (who[i].second) {
        options.rank0_stdout->append(buf, static_cast<size_t>(n));
        continue;
      }
      rk.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = rk.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
        flush_line(who[i].first, rk.partial.substr(start, nl - start));
      }
      rk.partial.erase(0, start);
    }
    // Forward signals.
    if (const int sig = TakeForwardedSignal(); sig != 0) {
      for (const Rank& rk : ranks) {
        if (rk.running) ::kill(rk.pid, sig);
      }
    }
    // Reap.
    for (int r = 0; r < nproc; ++r) {
      Rank& rk = ranks[r];
      if (!rk.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(rk.pid, &status, WNOHANG);
      if (got != rk.pid) continue;
      rk.running = false;
      int code = 0;
      std::string how;
      if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        how = "exited with code " + std::to_string(code);
      } else if (WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        how = "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
              SignalName(WTERMSIG(status)) + ")";
      }
      if (code == 0) continue;
      WriteAll(STDERR_FILENO, "strata: rank " + std::to_string(r) + " " + how + "\n");
      if (!failed) {
        failed = true;
        exit_code = code;
        term_at = Clock::now() + options.grace;
      }
    }
    // End the others after a failure.
    const Clock::time_point now = Clock::now();
    if (failed && !termed && now >= term_at) {
      termed = true;
      kill_at = now + options.kill_after;
      for (const Rank& rk : ranks) {
        if (!rk.running) continue;
        ::kill(rk.pid, SIGTERM);
        ::kill(rk.pid, SIGCONT);  // a stopped rank (SIGSTOP, Ctrl-Z) handles it only once running
      }
    }
    if (termed && !killed && now >= kill_at) {
      killed = true;
      for (const Rank& rk : ranks) {
        if (rk.running) ::kill(rk.pid, SIGKILL);
      }
    }
    // The pipes of reaped ranks may be held open by their own children: stop waiting for them
    // once every rank is gone and they have been quiet for a poll round.
    if (!any_running) {
      bool quiet = true;
      for (const pollfd& p : fds) quiet = quiet && p.revents == 0;
      if (quiet) break;
    }
  }
  for (int r = 0; r < nproc; ++r) {
    if (ranks[r].err_fd >= 0) {
      if (!ranks[r].partial.empty()) flush_line(r, ranks[r].partial);
      ::close(ranks[r].err_fd);
    }
    if (ranks[r].out_fd >= 0) ::close(ranks[r].out_fd);
  }
  if (!start_error.ok()) return start_error;
  return exit_code;
}

}  // namespace strata::runtime
