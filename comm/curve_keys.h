// CurveZMQ key pairs (RFC 26) for the authenticated control plane, and the
// files that hold them.
//
// Keys are Z85 text (ZeroMQ RFC 32): 40 characters for a 32-byte key. The
// files use ZeroMQ's certificate format (ZPL, as czmq's zcert_save writes
// it), so that czmq tools read them too; headway-keygen writes a pair:
//
//   PATH          the public certificate: may be copied anywhere
//     curve
//         public-key = "<40 Z85 characters>"
//   PATH_secret   the secret certificate, mode 0600: both keys
//     curve
//         public-key = "<40 Z85 characters>"
//         secret-key = "<40 Z85 characters>"
//
// Readers take the first `public-key = "..."` and `secret-key = "..."`
// lines of a file and ignore every other line (comments start with '#').
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace headway {

// One CURVE key pair, both Z85 (40 characters each).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

// True when this libzmq was built with CURVE (zmq_has("curve")).
bool CurveAvailable();

// A fresh key pair (zmq_curve_keypair: libsodium's random source).
// Errors: Unimplemented when libzmq lacks CURVE.
Result<CurveKeyPair> GenerateCurveKeyPair();

// OK if `key` is 40 Z85 characters that decode to 32 bytes. Errors:
// InvalidArgument naming `what` (e.g. the file it came from).
Status CheckZ85Key(const std::string& key, const std::string& what);

// Writes `path` (the public certificate, mode 0644) and `path + "_secret"`
// (both keys, mode 0600, created with that mode so the secret is never
// readable by others). Refuses to overwrite either file. Errors:
// FailedPrecondition naming the file that exists; Unavailable when a file cannot
// be written.
Status WriteCurveKeyFiles(const CurveKeyPair& pair, const std::string& path);

// Reads a secret certificate (headway-keygen's PATH_secret): both keys,
// checked to be a pair (zmq_curve_public). Errors: NotFound when the file
// cannot be read; InvalidArgument naming the file when a key is missing,
// malformed, or the two keys do not belong together.
Result<CurveKeyPair> ReadCurveSecretKeyFile(const std::string& path);

// Reads the public key of a certificate, public or secret. Errors: as
// ReadCurveSecretKeyFile, for the public key alone.
Result<std::string> ReadCurvePublicKeyFile(const std::string& path);

// The allow-list of client public keys: `path` is one file holding one or
// more `public-key = "..."` lines, or a directory whose every regular file
// not ending in "_secret" is a public certificate (czmq's certificate
// store). Errors: NotFound when `path` cannot be read; InvalidArgument
// naming the file of a malformed key, or `path` when it holds no key.
Result<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path);

}  // namespace headway
