// ZeroMQ plumbing shared by shards and workers: zero-copy payload messages, socket set-up,
// and multipart send/receive that report failures as Status instead of throwing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.hpp"
#include "common/wire.hpp"

namespace parasol {

// A heap buffer whose ownership can be handed to a ZeroMQ message, which frees it once the
// bytes have left the process. The contents start uninitialised.
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  static OwnedBuffer Allocate(size_t bytes);

  std::byte* data() { return data_.get(); }
  size_t size() const { return size_; }
  float* floats() { return reinterpret_cast<float*>(data_.get()); }

  // Transfers ownership into a message; this buffer becomes empty. No copy is made.
  zmq::message_t ToMessage() &&;

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

// Counts frames that still reference caller-owned memory. ZeroMQ's I/O thread calls Release()
// when it has finished with a frame; WaitReleased() blocks until none remain.
class BorrowTracker {
 public:
  void Acquire();
  void Release();
  void WaitReleased();

 private:
  std::atomic<int64_t> outstanding_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// A message that points at caller memory instead of copying it. The caller must keep `data`
// alive until `tracker->WaitReleased()` returns; `tracker` must outlive that wait.
zmq::message_t BorrowedMessage(const void* data, size_t size, BorrowTracker* tracker);

// A message that points into memory kept alive by `owner`; the message holds a share of it
// until ZeroMQ has sent the bytes. No copy is made.
zmq::message_t SharedMessage(std::shared_ptr<const void> owner, const void* data, size_t size);

// Options for every data socket: unbounded queues (back-pressure comes from the protocol's
// request/reply pairing, and a dropped frame would lose an update), a bounded linger, and a
// send time-out so that no send can block for ever (a peer that never completes its handshake).
void ConfigureDataSocket(zmq::socket_t& socket);

// Sends every frame in order; the frames are consumed. Never throws. With `dontwait`, a
// socket that cannot take the message now (no peer ready) refuses it at once.
Status SendFrames(zmq::socket_t& socket, std::vector<zmq::message_t>& frames,
                  bool dontwait = false);

// Receives one whole multipart message; an empty optional means nothing was waiting (with
// dontwait) or the wait was interrupted. Never throws.
Result<std::optional<std::vector<zmq::message_t>>> RecvFrames(zmq::socket_t& socket,
                                                              bool dontwait);
// The same into `frames` (cleared first, its capacity reused): true when a message came.
Result<bool> RecvFramesInto(zmq::socket_t& socket, bool dontwait,
                            std::vector<zmq::message_t>* frames);

// Makes glibc serve large message buffers from the heap and keep freed memory for reuse. By
// default each received frame above the (dynamic, at most 32 MiB) mmap threshold gets a fresh
// mapping, and the page faults of filling it cost more than the bytes' trip over loopback.
// Call once at process start, before other threads exist.
void TuneAllocatorForLargeMessages();

// "tcp://host:port".
std::string TcpEndpoint(const std::string& host, uint16_t port);

// Replaces each frame of f32 values in `frames` by its 16-bit copy in `dtype` (F16 or BF16;
// wire.compression). F16: one power-of-two scale for all of them (F16Scale of their largest
// finite magnitude), returned for the header's value_scale; 0 otherwise.
int NarrowValueFrames(std::span<zmq::message_t> frames, wire::DType dtype);

}  // namespace parasol
