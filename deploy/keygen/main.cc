// headway-keygen PATH: writes a CurveZMQ key pair for the control plane,
// PATH (the public key) and PATH_secret (both keys, mode 0600), in
// ZeroMQ's certificate format (comm/curve_keys.h), and prints the public
// key. Exit status: 0 written; 2 bad command line, or a file already there
// (never overwritten); 1 the files cannot be written or libzmq lacks CURVE.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "comm/curve_keys.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Writes a CurveZMQ key pair for Headway's control plane: PATH (public key: give it to "
      "the peers that must recognise the holder) and PATH_secret (mode 0600: keep it on the "
      "holder's host). README \"Security\" says which config keys name them."};
  std::string path;
  app.add_option("path", path, "public key file to write; the secret goes to PATH_secret")
      ->required();
  CLI11_PARSE(app, argc, argv);

  headway::Result<headway::CurveKeyPair> pair = headway::GenerateCurveKeyPair();
  if (!pair.ok()) {
    std::fprintf(stderr, "headway-keygen: %s\n", pair.status().message().c_str());
    return 1;
  }
  headway::Status written = headway::WriteCurveKeyFiles(*pair, path);
  if (!written.ok()) {
    std::fprintf(stderr, "headway-keygen: %s\n", written.message().c_str());
    return written.code() == headway::StatusCode::kFailedPrecondition ? 2 : 1;
  }
  std::printf("%s\n", pair->public_key.c_str());
  std::fprintf(stderr, "headway-keygen: wrote %s (public) and %s_secret (secret, mode 0600)\n",
               path.c_str(), path.c_str());
  return 0;
}
