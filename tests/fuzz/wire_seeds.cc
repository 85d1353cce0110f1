// Writes valid messages, in the fuzzer's framing, as the seed corpus of wire_fuzzer.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/wire.hpp"

namespace {

void Write(const std::string& path, const std::vector<std::string>& frames) {
  std::ofstream out(path, std::ios::binary);
  out.put(static_cast<char>(frames.size() - 1));
  for (const std::string& f : frames) {
    out.put(static_cast<char>(f.size() & 0xff));
    out.put(static_cast<char>(f.size() >> 8));
    out << f;
  }
}

std::string Frame(const parasol::Header& h) {
  zmq::message_t m = parasol::EncodeHeader(h);
  return std::string(static_cast<const char*>(m.data()), m.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  parasol::Header pull;
  pull.op = parasol::Op::PullSparse;
  pull.key_count = 2;
  pull.value_dim = 4;
  Write(dir + "/pull", {Frame(pull), std::string(16, '\x01')});
  parasol::Header push = pull;
  push.op = parasol::Op::PushSparse;
  push.value_frames = 1;
  push.rows_per_frame = 2;
  Write(dir + "/push", {Frame(push), std::string(16, '\x02'), std::string(32, '\x03')});
  parasol::Header dense;
  dense.op = parasol::Op::PushDense;
  dense.key_count = 6;
  dense.value_dim = 1;
  dense.value_frames = 2;
  dense.rows_per_frame = 4;
  Write(dir + "/dense", {Frame(dense), std::string(16, '\x04'), std::string(8, '\x05')});
  parasol::Header step;
  step.op = parasol::Op::Step;
  step.key_count = 2;
  Write(dir + "/step", {Frame(step), Frame(pull), std::string(16, '\x01'), Frame(push),
                        std::string(16, '\x02'), std::string(32, '\x03')});
  parasol::Header hello;
  hello.message = "hello";
  Write(dir + "/hello", {Frame(hello)});
  return 0;
}
