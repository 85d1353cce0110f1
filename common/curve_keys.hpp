// CURVE key pairs on disk, for authenticated and encrypted ZeroMQ connections.
//
// A key pair NAME is two files: NAME.key holds the secret key and NAME.pub the public key, each
// one line of 40 Z85 characters. A secret key file must not be readable by group or others.
#pragma once

#include <string>

#include "common/status.hpp"

namespace parasol {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// True when this libzmq was built with CURVE.
bool CurveAvailable();

Result<CurveKeyPair> GenerateCurveKeyPair();

// Writes DIR/NAME.key (mode 0600) and DIR/NAME.pub (mode 0644).
Status WriteCurveKeyPair(const std::string& dir, const std::string& name, const CurveKeyPair& k);

// Reads PATH.key (refusing open permissions) and derives the public key.
Result<CurveKeyPair> ReadCurveKeyPair(const std::string& path);
// Reads a public key file (PATH, or PATH.pub when PATH has no such file).
Result<std::string> ReadCurvePublicKey(const std::string& path);

// The Z85 text of a 32-byte binary key.
std::string Z85Key(const void* binary32);

}  // namespace parasol
