// `strata train --tensorboard DIR`: each step's report as TensorBoard scalars, under the tags
// Hugging Face's Trainer writes (its TensorBoardCallback: train/loss, train/learning_rate,
// train/grad_norm, train/epoch, eval/loss) plus eval/perplexity and strata's own
// train/tokens_per_second, train/step_seconds, train/nvme_read_bytes and train/nvme_written_bytes.
// train/epoch is written when the data has epochs (StepReport::epoch > 0), eval/* on the steps
// after which the run evaluated. The file is runtime/metrics/event_file.h's: a new one per run
// (a resumed run appends a file to DIR, as TensorBoard expects), written through after every step.
//
// Threads: the thread that runs the Trainer (its step callback).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/commands/trainer.h"
#include "runtime/metrics/event_file.h"

namespace strata::runtime {

// The scalars of one step, tagged as the file comment says.
std::vector<metrics::Scalar> TensorBoardScalars(const StepReport& r);

class TensorBoardLog {
 public:
  // Creates DIR (and parents) and a new event file in it; errors name the path and the errno.
  static Result<std::unique_ptr<TensorBoardLog>> Open(const std::string& dir);

  // Appends the step's scalars. After an error (ENOSPC, EIO) the log is broken: the caller ends
  // the run with it.
  Status Write(const StepReport& r) { return writer_.WriteScalars(r.step, TensorBoardScalars(r)); }

  // Closes the file (close(2)'s error: write-back errors on some filesystems).
  Status Close() { return writer_.Close(); }

  const std::string& path() const { return writer_.path(); }

 private:
  explicit TensorBoardLog(metrics::EventFileWriter writer) : writer_(std::move(writer)) {}
  metrics::EventFileWriter writer_;
};

}  // namespace strata::runtime
