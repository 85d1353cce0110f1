// libFuzzer target for the wire decoder: arbitrary bytes become a message of up to 8 frames
// (the first byte says how many, then a 2-byte length before each frame). Whatever the decoder
// accepts is then read in full (a Step's parts each as a message of its own), so
// AddressSanitizer sees any read outside the frames.
#include <zmq.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t count = 1 + data[0] % 8;
  size_t pos = 1;
  std::vector<zmq::message_t> frames;
  for (size_t f = 0; f < count && pos + 2 <= size; ++f) {
    size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    len = std::min(len, size - pos);
    frames.emplace_back(data + pos, len);
    pos += len;
  }
  if (frames.empty()) return 0;
  parasol::Result<parasol::Header> h = parasol::DecodeHeader(frames[0].data(), frames[0].size());
  if (!h.ok()) return 0;
  if (h->op == parasol::Op::Step) {
    // A Step: its parts, each read in full as a message of its own.
    auto parts = parasol::SplitStep(*h, std::span<const zmq::message_t>(frames).subspan(1));
    if (!parts.ok()) return 0;
    volatile uint64_t sink = 0;
    for (const parasol::StepPart& p : *parts) {
      auto v = parasol::PayloadView::Parse(
          p.header, std::span<zmq::message_t>(frames).subspan(2 + p.header_frame, p.payload_frames),
          1 << 20);
      if (!v.ok()) continue;
      if (v->has_keys()) {
        for (uint64_t i = 0; i < v->rows(); ++i) sink = sink + v->Key(i);
      }
      v->ForEachValueFrame([&](uint64_t, const std::byte* bytes, uint64_t rows) {
        for (uint64_t i = 0; i < rows * v->dim() * sizeof(float); ++i) sink = sink + static_cast<uint8_t>(bytes[i]);
      });
    }
    return 0;
  }
  auto view = parasol::PayloadView::Parse(*h, std::span<zmq::message_t>(frames).subspan(1),
                                          1 << 20);
  if (!view.ok()) return 0;
  volatile uint64_t sink = 0;
  if (view->has_keys()) {
    for (uint64_t i = 0; i < view->rows(); ++i) sink = sink + view->Key(i);
  }
  view->ForEachValueFrame([&](uint64_t first, const std::byte* bytes, uint64_t rows) {
    for (uint64_t i = 0; i < rows * view->dim() * sizeof(float); ++i) {
      sink = sink + static_cast<uint8_t>(bytes[i]) + first;
    }
  });
  return 0;
}
