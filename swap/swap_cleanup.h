// The swap spaces' cleanup registry (internal to swap/): what a fatal signal or exit() removes.
//
// A signal handler may only make async-signal-safe calls, so every live SwapSpace registers its
// run directory and file names in a fixed table of slots (plain char arrays published through
// atomics) instead of a container. RemoveSwapFilesForSignal (swap_space.h) walks the table: for
// every slot owned by this process and not marked keep it unlinks the files, then the run lock
// file (last: until the directory is gone, orphan reclaim elsewhere sees its owner alive, see
// run_dir.h), then removes the directory. The process's signal owner (base/signals.h) runs it on
// a fatal SIGINT/SIGTERM; RemoveCleanupFilesAtExit runs it at exit() for spaces never destroyed.
//
// Limits: 64 slots of 32 files; names over 95 characters and directories over 1023 are not
// registered (the destructor still removes them). Threads: any thread; a slot is written only by
// the SwapSpace that claimed it (under its mutex) and read by the handler.
#pragma once

#include <string>

namespace strata {

// Claims a slot for `dir` (registered as not kept); -1 when none is left or `dir` is too long.
int ClaimCleanupSlot(const std::string& dir);
// Adds a file name (relative to the slot's directory). Ignored for slot -1.
void AddCleanupFile(int slot, const std::string& name);
// Whether the slot's files stay (keep_files, a reattached directory). Ignored for slot -1.
void SetCleanupKeep(int slot, bool keep);
// Frees the slot (the SwapSpace removed its files itself). Ignored for slot -1.
void ReleaseCleanupSlot(int slot);
// Registers, once per process, an atexit hook that removes the registered files.
void RemoveCleanupFilesAtExit();

}  // namespace strata
