#include "base/env.h"

#include <cstdlib>
#include <string>

#include "base/logging.h"

namespace strata {
namespace {

constexpr EnvVar kVars[] = {
    {"STRATA_LOG_LEVEL", "info", "Least severe log line printed: debug, info, warning, error",
     "base/logging.cc"},
    {"STRATA_HOST_MEMORY", "auto",
     "The host budget when neither --host-memory nor strata.host_memory gives one: auto, a size "
     "(24G), or 0 (no host-RAM tier: every offloaded block on NVMe)",
     "runtime/commands/training_flags.cc"},
    {"STRATA_IO_BACKEND", "auto (io_uring, else libaio, else posix)",
     "NVMe I/O backend: uring, aio, posix or fault (tests)", "swap/io_backend.cc"},
    {"STRATA_CPU_ISA", "the best the CPU has (avx512, else avx2, else scalar)",
     "CPU optimizer kernels: avx512, avx2 or scalar (at most what the CPU supports)",
     "cpu_optimizer/isa.cc"},
    {"STRATA_SENTENCEPIECE_SHIM", "the module next to the data library",
     "Path of the SentencePiece module (libstrata_sentencepiece.so) the tokenizer loads",
     "runtime/data/tokenizer.cc"},
    {"STRATA_PYTHON", "the configured venv's python, then python3 on PATH",
     "The Python (with transformers and tokenizers) that runs a model's Hugging Face tokenizer",
     "runtime/data/hf_tokenizer.cc"},
    {"STRATA_TOKENIZER", "auto",
     "auto: transformers for tokenizer.json, SentencePiece for a tokenizer.model alone; "
     "transformers or sentencepiece to choose",
     "runtime/data/tokenizer.cc"},
    {"STRATA_LAUNCHER_PREFIXES", "a rank prefixes its own lines",
     "Set by `strata train --nproc` for its ranks: the launcher prefixes each rank's lines",
     "runtime/commands/trainer.cc"},
    {"STRATA_IO_FAULTS", "no faults",
     "Fault drill: eio:read:N, eio:write:N, enospc:write:N ... (swap/fault_spec.h)",
     "swap/fault_spec.cc", true},
    {"STRATA_NAN_GRADIENT", "no NaN injected",
     "Test hook: PARAMETER@STEP puts a NaN into that parameter's gradient at STEP",
     "runtime/engine/engine.cc", true},
    {"STRATA_TEST_KILL_AT_SAVE", "no rank killed",
     "Test hook: RANK@STEP kills that rank in the middle of the checkpoint of STEP",
     "runtime/commands/trainer.cc", true},
    {"RANK", "one rank (no torchrun)", "torchrun: this process's rank", "runtime/comm/dist_env.cc"},
    {"WORLD_SIZE", "one rank (no torchrun)", "torchrun: the number of ranks",
     "runtime/comm/dist_env.cc"},
    {"LOCAL_RANK", "required with WORLD_SIZE > 1", "torchrun: the rank on this machine",
     "runtime/comm/dist_env.cc"},
    {"LOCAL_WORLD_SIZE", "WORLD_SIZE", "torchrun: ranks on this machine",
     "runtime/comm/dist_env.cc"},
    {"MASTER_ADDR", "required with WORLD_SIZE > 1", "torchrun: the rendezvous host",
     "runtime/comm/dist_env.cc"},
    {"MASTER_PORT", "required with WORLD_SIZE > 1", "torchrun: the rendezvous port",
     "runtime/comm/dist_env.cc"},
    {"GLOO_SOCKET_IFNAME", "the interface MASTER_ADDR resolves through",
     "Network interface Gloo's ranks connect over", "runtime/comm/gloo_communicator.cc"},
    {"TORCH_NCCL_BLOCKING_WAIT", "1 (strata sets it for ranks on GPUs unless given)",
     "c10d waits for NCCL collectives on the host and throws at the timeout (libtorch 2.x)",
     "runtime/comm/nccl_communicator.cc"},
    {"NCCL_BLOCKING_WAIT", "1 (strata sets it for ranks on GPUs unless given)",
     "The same for libtorch 1.x", "runtime/comm/nccl_communicator.cc"},
    {"OMP_WAIT_POLICY", "PASSIVE (strata restarts itself with it set)",
     "OpenMP threads' waiting; given, strata leaves it as is", "runtime/commands/trainer.cc"},
    {"GOMP_SPINCOUNT", "libgomp's default",
     "GNU OpenMP spin count; given, strata leaves OpenMP as it is", "runtime/commands/trainer.cc"},
    {"COLUMNS", "80", "Terminal width for `strata train`'s lines when the terminal does not say",
     "runtime/commands/terminal_text.cc"},
};

}  // namespace

std::span<const EnvVar> EnvVars() { return kVars; }

const char* GetEnv(std::string_view name) {
  bool listed = false;
  for (const EnvVar& v : kVars) listed = listed || v.name == name;
  STRATA_CHECK(listed) << "environment variable " << name << " is read but not in base/env.cc";
  return std::getenv(std::string(name).c_str());
}

}  // namespace strata
