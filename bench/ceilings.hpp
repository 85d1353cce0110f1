// The machine's ceilings, measured in the same run as the figures they bound.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "common/status.hpp"

namespace parasol::bench {

// memcpy bandwidth in GB/s (bytes copied per second) over a buffer of `bytes`.
double MemcpyBandwidth(uint64_t bytes, int iters);

// Sequential write of `bytes` to a new file in `dir` in 1 MiB writes, then fsync: GB/s (the
// best a checkpoint of that size can be written to that disk). The file is removed.
double DiskWriteBandwidth(const std::string& dir, uint64_t bytes);
// Sequential read of the file at `path` in 1 MiB reads: GB/s (in the cache state it is in).
double FileReadBandwidth(const std::string& path);

// A plain child process that sends every message straight back (zero-copy on both sides):
// the best a request/reply over ZeroMQ on loopback can do.
class RawEcho {
 public:
  static Result<std::unique_ptr<RawEcho>> Start();
  ~RawEcho();

  // The fastest of `iters` round trips, in seconds: `bytes` sent in messages of 1 MiB (like
  // Parasol's chunks), each echoed as it arrives.
  double RoundTrip(uint64_t bytes, int warmup, int iters);

 private:
  RawEcho() = default;

  pid_t child_ = -1;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::dealer};
};

}  // namespace parasol::bench
