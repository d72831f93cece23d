#include "deploy/launcher/preflight.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "deploy/launcher/xxh64.h"

#ifndef HEADWAY_VERSION
#define HEADWAY_VERSION "unknown"
#endif

namespace headway::launcher {

const char* HeadwayVersion() { return HEADWAY_VERSION; }

Result<PreflightReport> LocalPreflight(const std::string& config_path,
                                       const std::string& head_pattern_path,
                                       const std::string& model_path) {
  PreflightReport report;
  report.version = HeadwayVersion();
  Xxh64 config_hash;
  if (Status s = HashFile(config_path, &config_hash); !s.ok()) {
    return Status::NotFound("config: " + s.message());
  }
  if (!head_pattern_path.empty()) {
    if (Status s = HashFile(head_pattern_path, &config_hash); !s.ok()) {
      return Status::NotFound("model.head_pattern: " + s.message());
    }
  }
  report.config_hash = FormatXxh64(config_hash.Digest());
  report.model_path = model_path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec)) {
    report.model_error = "not found";
    return report;
  }
  const uintmax_t bytes = std::filesystem::file_size(model_path, ec);
  Result<uint64_t> model_hash = FileXxh64(model_path);
  if (ec || !model_hash.ok()) {
    report.model_error = ec ? ec.message() : model_hash.status().message();
    return report;
  }
  report.model_bytes = int64_t(bytes);
  report.model_checksum = FormatXxh64(*model_hash);
  return report;
}

namespace {

// The problem with key file `path` (config key `key`) for this user; "" when
// there is none. `secret`: it must not be readable by every user.
std::string KeyFileProblem(const std::string& key, const std::string& path, bool secret) {
  const std::string what = key + " = " + path + ": ";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return what + "not found (copy the key file there)";
    return what + std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) return what + "is not a regular file";
  if (access(path.c_str(), R_OK) != 0) {
    return what + "cannot be read by user " + std::to_string(geteuid()) + " (" +
           std::strerror(errno) + "): the workers there run as that user";
  }
  if (secret && (st.st_mode & S_IROTH) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", unsigned(st.st_mode & 07777));
    return what + "is a secret key readable by every user (mode " + mode +
           "): chmod 600 it there";
  }
  return "";
}

}  // namespace

std::vector<std::string> CheckWorkerKeyFiles(const SecurityConfig& security) {
  std::vector<std::string> problems;
  if (!security.HasKeys()) return problems;
  for (const std::string& p :
       {KeyFileProblem("security.coordinator_public_key", security.coordinator_public_key, false),
        KeyFileProblem("security.client_key", security.client_key, true)}) {
    if (!p.empty()) problems.push_back(p);
  }
  return problems;
}

std::string FormatPreflight(const PreflightReport& report) {
  std::ostringstream out;
  out << "version=" << report.version << "\n";
  out << "config_hash=" << report.config_hash << "\n";
  out << "model_path=" << report.model_path << "\n";
  if (report.model_error.empty()) {
    out << "model_bytes=" << report.model_bytes << "\n";
    out << "model_checksum=" << report.model_checksum << "\n";
  } else {
    out << "model_error=" << report.model_error << "\n";
  }
  for (const std::string& e : report.key_errors) out << "key_error=" << e << "\n";
  return out.str();
}

Result<PreflightReport> ParsePreflight(const std::string& text) {
  std::map<std::string, std::string> values;
  std::vector<std::string> key_errors;  // the one key that may repeat
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string key = line.substr(0, eq);
    if (key.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos) continue;
    if (key == "key_error") key_errors.push_back(line.substr(eq + 1)); else values[key] = line.substr(eq + 1);
  }
  for (const char* key : {"version", "config_hash", "model_path"}) {
    if (values.count(key) == 0) {
      return Status::InvalidArgument(std::string("the preflight report has no `") + key + "`");
    }
  }
  PreflightReport report;
  report.version = values["version"];
  report.config_hash = values["config_hash"];
  report.model_path = values["model_path"];
  report.key_errors = std::move(key_errors);
  if (values.count("model_error") > 0) {
    report.model_error = values["model_error"];
    return report;
  }
  if (values.count("model_bytes") == 0 || values.count("model_checksum") == 0) {
    return Status::InvalidArgument(
        "the preflight report has neither model_bytes and model_checksum nor model_error");
  }
  char* end = nullptr;
  report.model_bytes = std::strtoll(values["model_bytes"].c_str(), &end, 10);
  if (end == values["model_bytes"].c_str() || *end != '\0') {
    return Status::InvalidArgument("the preflight report's model_bytes is not a number: " +
                                   values["model_bytes"]);
  }
  report.model_checksum = values["model_checksum"];
  return report;
}

std::vector<std::string> PreflightProblems(const PreflightReport& local,
                                           const PreflightReport& remote) {
  std::vector<std::string> problems;
  if (remote.version != local.version) {
    problems.push_back("headway-node there is version " + remote.version + ", this is " +
                       local.version + ": install the same build on every host");
  }
  if (remote.config_hash != local.config_hash) {
    problems.push_back("the config file (or its model.head_pattern file) differs from this "
                       "one (" + remote.config_hash + " there, " + local.config_hash +
                       " here): copy both to the same paths on every host");
  }
  if (!remote.model_error.empty()) {
    problems.push_back("model file " + remote.model_path + ": " + remote.model_error +
                       " (copy the model there, or set launch.model_dir)");
  } else if (remote.model_bytes != local.model_bytes) {
    problems.push_back("model file " + remote.model_path + " has " +
                       std::to_string(remote.model_bytes) + " bytes, " + local.model_path +
                       " here has " + std::to_string(local.model_bytes) +
                       ": copy the model there again");
  } else if (remote.model_checksum != local.model_checksum) {
    problems.push_back("model file " + remote.model_path + " has checksum " +
                       remote.model_checksum + ", " + local.model_path + " here has " +
                       local.model_checksum + ": copy the model there again");
  }
  problems.insert(problems.end(), remote.key_errors.begin(), remote.key_errors.end());
  return problems;
}

}  // namespace headway::launcher
