#include "common/curve_keys.hpp"

#include <sys/stat.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace parasol {
namespace {

Result<std::string> ReadKeyLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read key file '" + path + "': " + std::strerror(errno));
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  uint8_t binary[32];
  if (line.size() != 40 || zmq_z85_decode(binary, line.c_str()) == nullptr) {
    return InvalidArgument("key file '" + path + "' does not hold a 40-character Z85 key");
  }
  return line;
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

std::string Z85Key(const void* binary32) {
  char text[41];
  zmq_z85_encode(text, static_cast<const uint8_t*>(binary32), 32);
  return std::string(text, 40);
}

Result<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Unavailable(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{std::string(pub, 40), std::string(sec, 40)};
}

Status WriteCurveKeyPair(const std::string& dir, const std::string& name, const CurveKeyPair& k) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string secret = dir + "/" + name + ".key", pub = dir + "/" + name + ".pub";
  {
    std::ofstream out(secret, std::ios::trunc);
    if (!out) return IoError("cannot write '" + secret + "': " + std::strerror(errno));
    ::chmod(secret.c_str(), 0600);
    out << k.secret_key << "\n";
  }
  std::ofstream out(pub, std::ios::trunc);
  if (!out) return IoError("cannot write '" + pub + "': " + std::strerror(errno));
  out << k.public_key << "\n";
  ::chmod(pub.c_str(), 0644);
  return Status::Ok();
}

Result<CurveKeyPair> ReadCurveKeyPair(const std::string& path) {
  const std::string secret = path + ".key";
  struct stat st;
  if (::stat(secret.c_str(), &st) != 0) {
    return NotFound("cannot read key file '" + secret + "': " + std::strerror(errno));
  }
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 0777);
    return FailedPrecondition("secret key file '" + secret + "' is open to others (mode " +
                              mode + "); run chmod 600 on it");
  }
  PARASOL_ASSIGN_OR_RETURN(std::string sec, ReadKeyLine(secret));
  char pub[41];
  if (zmq_curve_public(pub, sec.c_str()) != 0) {
    return InvalidArgument("key file '" + secret + "' does not hold a CURVE secret key");
  }
  return CurveKeyPair{std::string(pub, 40), sec};
}

Result<std::string> ReadCurvePublicKey(const std::string& path) {
  if (std::filesystem::exists(path)) return ReadKeyLine(path);
  return ReadKeyLine(path + ".pub");
}

}  // namespace parasol
