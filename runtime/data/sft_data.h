// Supervised fine-tuning (SFT) data: a .jsonl file of prompt/completion records, trained on the
// completion only, as TRL's SFTTrainer trains prompt-completion data (completion_only_loss).
//
// A record is one JSON object per line (blank lines skipped), of one of three kinds; a file holds
// one kind (a mix, or a "text" record among them, is refused naming the line):
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}, ...]}   a chat
//        (TRL's conversational format): the ids are apply_chat_template(messages)'s, and only the
//        assistant turns are trained on (hf_tokenizer.h: the template's {% generation %} marks,
//        else what each assistant turn adds to the conversation before it). Needs the model's
//        tokenizer with a chat template (transformers).
//   {"prompt": "...", "completion": "..."}   text, tokenized as TRL's SFTTrainer does: the ids
//        are Encode(prompt + completion) followed by the EOS id (tokenizer.h: BOS in front as
//        tokenizer_config.json says; EOS not repeated when add_eos_token already put it there),
//        and the first len(Encode(prompt)) of them are the prompt. When that is not a prefix of
//        the whole (SentencePiece merged across the boundary) the record is kept and counted, as
//        TRL warns and keeps it. Needs the model directory's tokenizer.model.
//   {"prompt_ids": [...], "completion_ids": [...]}   token ids, taken as given: the prompt's then
//        the completion's, nothing added (any model, presets included).
// Every id is checked against the model's vocab_size; a record without its prompt or completion,
// or with an empty completion, is refused naming the file and the line.
//
// Targets: the target of input position t is token t + 1 when that token is a completion token,
// else kIgnoredTarget (-100, torch's cross_entropy ignore_index): prompt positions and padding
// never reach the loss. The first completion token is predicted from the last prompt token.
//
// Two layouts (TRL's packing=False default, and --packing):
//   padded   one record per row: its first seq_len + 1 tokens (a longer record is truncated, as
//            TRL truncates to max_length), inputs padded with `pad_id` (the targets there are
//            ignored; with causal attention padding cannot change the logits of the positions
//            before it). Training sample k is record WindowSampler::Sample(k).
//   packed   the records concatenated in file order and cut into windows of seq_len + 1 tokens as
//            windows.h cuts token data (the tail shorter than a window is dropped), the completion
//            flags kept: training sample k is window WindowSampler::Sample(k).
// Either way training sample k depends on (data, seed, k) only, and Windows(seq) is the number of
// samples of an epoch (records, or windows). Evaluation reads them in order.
//
// Thread-safety: the TrainingData returned is immutable after Open (its sampler guards its cache).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/data/training_data.h"

namespace strata::runtime {

struct SftDataOptions {
  std::string path;        // .jsonl
  std::string model_dir;   // text records: the directory with tokenizer.model ("" for presets)
  int64_t vocab_size = 0;  // every id must be below it
  int seq_len = 0;         // rows hold seq_len + 1 tokens
  bool packing = false;    // packed windows instead of one padded record per row
  uint64_t seed = 0;       // the training order
  int64_t pad_id = 0;      // padded inputs (never a target)
};

// What Open found, for the run's start-up report (one epoch's numbers).
struct SftSummary {
  std::string kind;  // "prompt/completion", "prompt_ids/completion_ids" or "chat (\"messages\")"
  uint64_t records = 0;
  uint64_t tokens = 0;  // prompt and completion tokens of every record
  uint64_t completion_tokens = 0;
  uint64_t samples = 0;         // rows of an epoch: records (padded) or windows (packed)
  uint64_t trained_tokens = 0;  // targets that reach the loss in an epoch
  uint64_t truncated = 0;       // padded: records longer than seq_len + 1 tokens
  uint64_t truncated_completion_tokens = 0;  // padded: completion tokens those lost
  uint64_t untrained_records = 0;            // padded: records left with no trained target
  uint64_t dropped_tokens = 0;               // packed: the tail shorter than a window
  uint64_t prompt_mismatches = 0;            // text: Encode(prompt) not a prefix of the whole
};

// The records of a file, tokenized and flattened.
struct SftRecords {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> completion;  // per token: 1 for a trained token (completion, assistant)
  std::vector<uint64_t> begin{0};   // record r is [begin[r], begin[r + 1])
  uint64_t count() const { return begin.size() - 1; }
};

// Whether the .jsonl `path` holds SFT records: its first non-blank line is a JSON object with a
// "messages", "prompt", "completion", "prompt_ids" or "completion_ids" key. False for any other
// extension and for a first line without them or that is not JSON (the other readers take the file
// and report that). Errors: kNotFound for a missing file, kIoError when it cannot be read.
Result<bool> IsSftFile(const std::string& path);

// Reads, checks and tokenizes the whole file into its records (what OpenSftData cuts rows from, and
// what `strata tokenize` writes). Uses path, model_dir and vocab_size of `options`; fills the
// summary's kind, records, tokens and completion_tokens. Errors as OpenSftData's, but for the
// ones about seq_len and packing.
Result<SftRecords> ReadSftRecords(const SftDataOptions& options, SftSummary* summary);

// Reads, checks and tokenizes the whole file (see the file comment). Errors name the file and the
// line: kInvalidArgument for bad records, a mix of kinds, ids >= vocab_size, text records without
// a tokenizer, no record at all, and (packed) fewer tokens than one window.
Result<std::unique_ptr<TrainingData>> OpenSftData(const SftDataOptions& options,
                                                  SftSummary* summary);

}  // namespace strata::runtime
