#include "bench/ceilings.hpp"

#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/net.hpp"
#include "common/transport.hpp"

namespace parasol::bench {
namespace {

constexpr uint64_t kFrameBytes = 1 << 20;  // Parasol's default server.frame_bytes

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void EchoLoop(uint16_t port) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  ConfigureDataSocket(router);
  router.bind(TcpEndpoint("127.0.0.1", port));
  // Bounded: the parent kills this process when done; a lost parent ends it after an idle hour.
  router.set(zmq::sockopt::rcvtimeo, 3600 * 1000);
  while (true) {
    auto frames = RecvFrames(router, false);
    if (!frames.ok() || !frames->has_value()) _exit(0);
    if (!SendFrames(router, **frames).ok()) _exit(1);
  }
}

}  // namespace

double DiskWriteBandwidth(const std::string& dir, uint64_t bytes) {
  const std::string path = dir + "/disk-ceiling.bin";
  std::vector<char> block(1 << 20, 7);
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - done));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w <= 0) break;
    done += static_cast<uint64_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::unlink(path.c_str());
  return bytes / s / 1e9;
}

double FileReadBandwidth(const std::string& path) {
  std::vector<char> block(1 << 20);
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t total = 0;
  while (true) {
    const ssize_t r = ::read(fd, block.data(), block.size());
    if (r <= 0) break;
    total += static_cast<uint64_t>(r);
  }
  ::close(fd);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return total / s / 1e9;
}

double MemcpyBandwidth(uint64_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < iters + 1; ++i) {
    const auto s = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    if (i > 0) t.push_back(d);  // the first pass faults the pages in
    a[i % bytes] = b[(i * 7) % bytes];
  }
  return bytes / Median(t) / 1e9;
}

Result<std::unique_ptr<RawEcho>> RawEcho::Start() {
  PARASOL_ASSIGN_OR_RETURN(uint16_t port, PickFreePort());
  const pid_t pid = ::fork();
  if (pid < 0) return IoError("fork failed");
  if (pid == 0) EchoLoop(port);
  std::unique_ptr<RawEcho> e(new RawEcho());
  e->child_ = pid;
  ConfigureDataSocket(e->socket_);
  e->socket_.connect(TcpEndpoint("127.0.0.1", port));
  return e;
}

RawEcho::~RawEcho() {
  if (child_ > 0) {
    ::kill(child_, SIGKILL);
    ::waitpid(child_, nullptr, 0);
  }
}

double RawEcho::RoundTrip(uint64_t bytes, int warmup, int iters) {
  std::vector<zmq::message_t> originals;
  for (uint64_t off = 0; off < bytes; off += kFrameBytes) {
    OwnedBuffer b = OwnedBuffer::Allocate(std::min(kFrameBytes, bytes - off));
    std::memset(b.data(), 1, b.size());
    originals.push_back(std::move(b).ToMessage());
  }
  std::vector<double> t;
  for (int i = 0; i < warmup + iters; ++i) {
    // Each frame a message of its own, echoed as it arrives: the transport's best for these
    // bytes each way, pipelined like Parasol's chunked requests (a single multipart message
    // is stored and forwarded whole, and Parasol's 64 MB push+pull beat that).
    const auto s = std::chrono::steady_clock::now();
    for (auto& o : originals) {
      std::vector<zmq::message_t> frame(1);
      frame[0].copy(o);  // shares the buffer: nothing is copied
      if (!SendFrames(socket_, frame).ok()) return -1;
    }
    for (size_t m = 0; m < originals.size(); ++m) {
      auto back = RecvFrames(socket_, false);
      if (!back.ok() || !back->has_value()) return -1;
    }
    const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    if (i >= warmup) t.push_back(d);
  }
  // A ceiling is what the transport can do at best: the fastest round trip, not the median
  // (a median ceiling, as noisy as the figure it bounds, was sometimes beaten by it).
  return *std::min_element(t.begin(), t.end());
}

}  // namespace parasol::bench
