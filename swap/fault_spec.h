// STRATA_IO_FAULTS: a test hook that makes the I/O backends strata opens inject faults, so that a
// test can drive the real binary (`strata train`) into an NVMe error at a chosen request and check
// what the user sees. Not for production use: a warning is logged whenever it is active.
//
//   STRATA_IO_FAULTS="eio:read:5"                  the 5th read request fails with EIO
//   STRATA_IO_FAULTS="enospc:write:1,eio:any:40"   the 1st write gets ENOSPC, the 40th request EIO
//   STRATA_IO_FAULTS="flip:write@optimizer:3"      the 3rd write to optimizer.swp reaches the disk
//                                                  with one bit flipped (and succeeds)
//
// Grammar: RULE[,RULE...] with RULE = KIND:DIRECTION:N[:BIT], where KIND is a FaultKindName (eio,
// enospc, eagain, short, eof, latency, flip), DIRECTION is read, write or any, optionally followed
// by @FILE, and N >= 1 counts the requests of that direction (to files whose name starts with
// FILE, e.g. params, gradients, optimizer: SwapSpace's <kind>.swp) submitted to one backend, from
// 1. BIT, for flip only, is the bit of the request to flip (FaultRule::flip_bit; default 30).
// Each rule's other FaultRule fields keep their defaults (an EIO hits before any byte moves).
// Every backend OpenIoBackend returns is wrapped with its own counters; the probe I/O of "auto"
// happens before the wrapping and is not counted.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "swap/fault_injecting_backend.h"
#include "swap/io_backend.h"

namespace strata {

inline constexpr const char* kIoFaultsEnv = "STRATA_IO_FAULTS";

// Parses the grammar above into rules (FaultRule::request is 0-based: N - 1). InvalidArgument
// naming the bad rule.
Result<std::vector<FaultRule>> ParseFaultSpec(std::string_view spec);

// `backend` wrapped in a FaultInjectingBackend with the rules of STRATA_IO_FAULTS if the variable
// is set and not empty; `backend` itself otherwise. InvalidArgument naming the variable for a
// spec that does not parse (the backend is then closed).
Result<std::unique_ptr<IoBackend>> WrapWithFaultsFromEnv(std::unique_ptr<IoBackend> backend);

}  // namespace strata
