#include "bench/io_cli.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>

#include "base/bytes.h"
#include "runtime/commands/flag_checks.h"

namespace strata::bench {

void AddIoCliFlags(CLI::App& cmd, IoCliFlags* flags, bool sweep) {
  cmd.add_option("--path", flags->path,
                 "Directory on the disk to measure (default: the current directory)")
      ->check(runtime::flags::InputDirectory());
  if (!sweep) {
    cmd.add_option("--block-size", flags->block_size,
                   "Bytes per request, e.g. 128K, 1M (aio.block_size; default 1M)")
        ->check(runtime::flags::ByteSize(512, uint64_t{1} << 30));
    cmd.add_option("--queue-depth", flags->queue_depth,
                   "Requests in flight per thread (aio.queue_depth; default 32)")
        ->check(CLI::Range(1, 4096));
    cmd.add_option("--threads", flags->threads,
                   "Intra-op parallelism: rings/contexts working at once "
                   "(aio.intra_op_parallelism; default 1)")
        ->check(CLI::Range(1, 64));
    cmd.add_option("--backend", flags->backend,
                   "auto|uring|aio|posix (default auto: STRATA_IO_BACKEND, else the first that "
                   "works of uring, aio, posix)")
        ->check(CLI::IsMember({"auto", "uring", "aio", "posix"}));
  }
  cmd.add_flag("--buffered", flags->buffered,
               "Use the page cache instead of O_DIRECT (writes include a final fdatasync; the "
               "cache is dropped before reads)");
  cmd.add_flag("--single-submit", flags->single_submit,
               "One submission system call per request (aio.single_submit)");
  cmd.add_flag("--sequential-requests", flags->sequential,
               "Submit in batches of queue_depth and wait for each batch (aio.overlap_events "
               "false)");
}

Status ResolveIoCliFlags(const IoCliFlags& flags, IoBenchConfig* config) {
  struct stat st {};
  if (stat(flags.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError("--path " + flags.path + " is not an existing directory");
  }
  config->dir = flags.path;
  config->backend = flags.backend;
  config->buffered = flags.buffered;
  STRATA_ASSIGN_OR_RETURN(uint64_t block, ParseBytes(flags.block_size));
  config->io.block_size = block;
  config->io.queue_depth = flags.queue_depth;
  config->io.intra_op_parallelism = flags.threads;
  config->io.single_submit = flags.single_submit;
  config->io.overlap_events = !flags.sequential;
  return ValidateIoOptions(config->io);
}

}  // namespace strata::bench
