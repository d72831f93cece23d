#include "comm/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace headway {
namespace {

constexpr size_t kZ85KeyChars = 40;

// The quoted value of the first line `name = "value"` (leading blanks
// allowed), or "" when there is none.
std::string FindKey(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line.compare(start, name.size(), name) != 0) continue;
    size_t eq = line.find('=', start + name.size());
    if (eq == std::string::npos) continue;
    if (line.find_first_not_of(" \t", start + name.size()) != eq) continue;  // "public-keyX"
    size_t open = line.find('"', eq);
    size_t close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close == std::string::npos) return line.substr(eq + 1);  // reported as malformed
    return line.substr(open + 1, close - open - 1);
  }
  return "";
}

// Every `public-key = "..."` value of `text`, in order.
std::vector<std::string> FindAllPublicKeys(const std::string& text) {
  std::vector<std::string> keys;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::string key = FindKey(line, "public-key");
    if (!key.empty()) keys.push_back(std::move(key));
  }
  return keys;
}

Result<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + what + " `" + path + "`: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Certificate(const CurveKeyPair& pair, bool with_secret) {
  std::string text = with_secret
                         ? "#   ZeroMQ CURVE **Secret** Certificate (headway-keygen)\n"
                           "#   Keep it private: it authenticates its holder.\n\n"
                         : "#   ZeroMQ CURVE Public Certificate (headway-keygen)\n"
                           "#   Give it to the peers that must recognise its holder.\n\n";
  text += "metadata\ncurve\n    public-key = \"" + pair.public_key + "\"\n";
  if (with_secret) text += "    secret-key = \"" + pair.secret_key + "\"\n";
  return text;
}

// Creates `path` with `mode` (O_EXCL: never over an existing file) and
// writes `text`.
Status WriteNewFile(const std::string& path, const std::string& text, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return Status::FailedPrecondition("`" + path + "` exists: remove it first, or choose another path");
    }
    return Status::Unavailable("cannot create `" + path + "`: " + std::strerror(errno));
  }
  // The umask may have cleared bits of `mode`, never added any; fchmod
  // makes the public file readable whatever the umask.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t written = 0;
  while (ok && written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) written += size_t(n);
  }
  const int saved = errno;
  if (::close(fd) != 0) ok = false;
  if (!ok) {
    ::unlink(path.c_str());
    return Status::Unavailable("cannot write `" + path + "`: " + std::strerror(saved));
  }
  return Status::Ok();
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

Result<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) {
    return Status::Unimplemented("this libzmq is built without CURVE (zmq_has(\"curve\") is false)");
  }
  char public_key[kZ85KeyChars + 1] = {};
  char secret_key[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return Status::Internal(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{public_key, secret_key};
}

Status CheckZ85Key(const std::string& key, const std::string& what) {
  uint8_t bytes[32];
  if (key.size() != kZ85KeyChars || zmq_z85_decode(bytes, key.c_str()) == nullptr) {
    return Status::InvalidArgument(what + ": \"" + key +
                                   "\" is not a CURVE key: must be 40 Z85 characters "
                                   "(as headway-keygen writes)");
  }
  return Status::Ok();
}

Status WriteCurveKeyFiles(const CurveKeyPair& pair, const std::string& path) {
  HW_RETURN_IF_ERROR(CheckZ85Key(pair.public_key, "public key"));
  HW_RETURN_IF_ERROR(CheckZ85Key(pair.secret_key, "secret key"));
  const std::string secret_path = path + "_secret";
  // Both or neither: check first, so that an existing secret file does not
  // leave a new public file behind it.
  for (const std::string& p : {path, secret_path}) {
    if (::access(p.c_str(), F_OK) == 0) {
      return Status::FailedPrecondition("`" + p + "` exists: remove it first, or choose another path");
    }
  }
  HW_RETURN_IF_ERROR(WriteNewFile(secret_path, Certificate(pair, true), 0600));
  Status s = WriteNewFile(path, Certificate(pair, false), 0644);
  if (!s.ok()) ::unlink(secret_path.c_str());
  return s;
}

Result<CurveKeyPair> ReadCurveSecretKeyFile(const std::string& path) {
  HW_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "CURVE secret key file"));
  CurveKeyPair pair{FindKey(text, "public-key"), FindKey(text, "secret-key")};
  if (pair.secret_key.empty()) {
    return Status::InvalidArgument("`" + path +
                                   "` holds no `secret-key = \"...\"` line: it is not a secret "
                                   "key file (headway-keygen PATH writes PATH_secret)");
  }
  HW_RETURN_IF_ERROR(CheckZ85Key(pair.secret_key, "`" + path + "` secret-key"));
  char derived[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(derived, pair.secret_key.c_str()) != 0) {
    return Status::InvalidArgument("`" + path + "`: cannot derive the public key: " +
                                   zmq_strerror(zmq_errno()));
  }
  if (pair.public_key.empty()) pair.public_key = derived;
  if (pair.public_key != derived) {
    return Status::InvalidArgument("`" + path +
                                   "`: public-key does not belong to secret-key (the file was "
                                   "edited; write a new pair with headway-keygen)");
  }
  return pair;
}

Result<std::string> ReadCurvePublicKeyFile(const std::string& path) {
  HW_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "CURVE public key file"));
  std::string key = FindKey(text, "public-key");
  if (key.empty()) {
    return Status::InvalidArgument("`" + path +
                                   "` holds no `public-key = \"...\"` line: it is not a CURVE "
                                   "key file (headway-keygen writes them)");
  }
  HW_RETURN_IF_ERROR(CheckZ85Key(key, "`" + path + "` public-key"));
  return key;
}

Result<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || name.ends_with("_secret") || name.starts_with(".")) continue;
      files.push_back(e.path().string());
    }
    if (ec) return Status::NotFound("cannot list authorized keys `" + path + "`: " + ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<std::string> keys;
  for (const std::string& file : files) {
    HW_ASSIGN_OR_RETURN(std::string text, ReadFile(file, "authorized keys file"));
    for (std::string& key : FindAllPublicKeys(text)) {
      HW_RETURN_IF_ERROR(CheckZ85Key(key, "`" + file + "` public-key"));
      keys.push_back(std::move(key));
    }
  }
  if (keys.empty()) {
    return Status::InvalidArgument("authorized keys `" + path +
                                   "` hold no `public-key = \"...\"` line: no client could "
                                   "register (add the clients' public key files, from "
                                   "headway-keygen)");
  }
  return keys;
}

}  // namespace headway
