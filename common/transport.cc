#include "common/transport.hpp"

#include <algorithm>
#include <cmath>

#include <malloc.h>

#include <zmq_addon.hpp>

namespace parasol {
namespace {

void FreeOwned(void* data, void* /*hint*/) { delete[] static_cast<std::byte*>(data); }

void ReleaseShared(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

void ReleaseBorrowed(void* /*data*/, void* hint) { static_cast<BorrowTracker*>(hint)->Release(); }

}  // namespace

OwnedBuffer OwnedBuffer::Allocate(size_t bytes) {
  OwnedBuffer b;
  b.data_ = std::make_unique_for_overwrite<std::byte[]>(bytes == 0 ? 1 : bytes);
  b.size_ = bytes;
  return b;
}

zmq::message_t OwnedBuffer::ToMessage() && {
  if (size_ == 0) {
    data_.reset();
    return zmq::message_t();
  }
  std::byte* raw = data_.release();
  const size_t n = size_;
  size_ = 0;
  return zmq::message_t(raw, n, &FreeOwned, nullptr);
}

void BorrowTracker::Release() {
  // Decrement under the lock so that a waiter cannot see zero, return and destroy the tracker
  // while this call still touches it.
  std::lock_guard<std::mutex> lock(mu_);
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_.notify_all();
}

void BorrowTracker::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.fetch_add(1, std::memory_order_relaxed);
}

void BorrowTracker::WaitReleased() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return outstanding_.load(std::memory_order_acquire) == 0; });
}

zmq::message_t BorrowedMessage(const void* data, size_t size, BorrowTracker* tracker) {
  if (size == 0) return zmq::message_t();
  tracker->Acquire();
  return zmq::message_t(const_cast<void*>(data), size, &ReleaseBorrowed, tracker);
}

zmq::message_t SharedMessage(std::shared_ptr<const void> owner, const void* data, size_t size) {
  if (size == 0) return zmq::message_t();
  auto* hint = new std::shared_ptr<const void>(std::move(owner));
  return zmq::message_t(const_cast<void*>(data), size, &ReleaseShared, hint);
}

void ConfigureDataSocket(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::sndhwm, 0);
  socket.set(zmq::sockopt::rcvhwm, 0);
  socket.set(zmq::sockopt::linger, 1000);
  socket.set(zmq::sockopt::sndtimeo, 5000);
}

Status SendFrames(zmq::socket_t& socket, std::vector<zmq::message_t>& frames, bool dontwait) {
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (dontwait) flags = flags | zmq::send_flags::dontwait;
      if (!socket.send(frames[i], flags)) return Unavailable("send would block");
    }
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("zmq send failed: ") + e.what());
  }
  return Status::Ok();
}

Result<bool> RecvFramesInto(zmq::socket_t& socket, bool dontwait,
                            std::vector<zmq::message_t>* frames) {
  frames->clear();
  try {
    auto n = zmq::recv_multipart(socket, std::back_inserter(*frames),
                                 dontwait ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!n) return false;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    return Unavailable(std::string("zmq receive failed: ") + e.what());
  }
  return true;
}

Result<std::optional<std::vector<zmq::message_t>>> RecvFrames(zmq::socket_t& socket,
                                                              bool dontwait) {
  std::vector<zmq::message_t> frames;
  PARASOL_ASSIGN_OR_RETURN(const bool got, RecvFramesInto(socket, dontwait, &frames));
  if (!got) return std::optional<std::vector<zmq::message_t>>();
  return std::optional<std::vector<zmq::message_t>>(std::move(frames));
}

void TuneAllocatorForLargeMessages() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

std::string TcpEndpoint(const std::string& host, uint16_t port) {
  return "tcp://" + host + ":" + std::to_string(port);
}

int NarrowValueFrames(std::span<zmq::message_t> frames, wire::DType dtype) {
  int scale = 0;
  if (dtype == wire::DType::F16) {
    float max_abs = 0;
    for (const zmq::message_t& m : frames) {
      const auto* v = static_cast<const float*>(m.data());
      for (size_t i = 0; i < m.size() / sizeof(float); ++i) {
        if (std::isfinite(v[i])) max_abs = std::max(max_abs, std::abs(v[i]));
      }
    }
    scale = F16Scale(max_abs);
  }
  for (zmq::message_t& m : frames) {
    const size_t n = m.size() / sizeof(float);
    OwnedBuffer narrow = OwnedBuffer::Allocate(n * 2);
    NarrowValues(static_cast<const float*>(m.data()), n, dtype, scale, narrow.data());
    m = std::move(narrow).ToMessage();
  }
  return scale;
}

}  // namespace parasol
