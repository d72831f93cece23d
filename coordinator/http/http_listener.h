// The HTTP API's connections. cpp-httplib parses requests and runs the
// routes (Server::process_request); this class owns what happens around
// them, because Debian's cpp-httplib 0.11 has no total deadline (its read
// timeout restarts on every byte, so a client sending a header byte a
// second holds a thread for ever) and no connection limit (connections
// beyond its thread pool wait in an unbounded queue):
//
//   * accept: at most max_connections open at once, each on a thread of
//     its own; one more gets 503 (plain HTTP) or is closed (TLS) at once,
//     by the accepting thread.
//   * read: a request's line, headers and body must all arrive within
//     read_timeout of its first byte. A new connection has read_timeout
//     for its TLS handshake, and read_timeout to start its first request.
//   * idle: a kept-alive connection with no new request for
//     keep_alive_timeout is closed.
//   * write: a write that makes no progress for write_timeout fails (the
//     handler sees a failed write; a stream is cancelled).
//   * TLS (ssl_certfile, ssl_keyfile): every connection is HTTPS via
//     OpenSSL (TLS 1.2 or later); there is no plain listener beside it.
//
// Only the routes are httplib's: register them on this object as on any
// httplib::Server, then Bind and Serve (not listen/bind_to_port/stop).
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace headway {

struct HttpListenerOptions {
  int max_connections = 256;
  // A request's line and headers fail to read (400) past 8 KiB plus this;
  // the routes answer 431 for headers over it (api_server.h).
  int max_header_bytes = 16384;
  std::chrono::milliseconds read_timeout{30000};        // per request, total
  std::chrono::milliseconds keep_alive_timeout{5000};   // between requests
  std::chrono::milliseconds write_timeout{30000};       // per stalled write
  std::string ssl_certfile;                             // PEM; "" = plain HTTP
  std::string ssl_keyfile;                              // PEM; set with ssl_certfile
};

class HttpListener final : public httplib::Server {
 public:
  explicit HttpListener(HttpListenerOptions options);
  ~HttpListener() override;

  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Loads the TLS certificate chain and key when set. Errors:
  // InvalidArgument naming the file and OpenSSL's reason (unreadable, not
  // PEM, key not matching the certificate). Call once, before Bind.
  Status LoadTls();

  // Binds and listens on host:port (port 0: any free port) and returns the
  // port. Errors: Unavailable naming host and port (in use, not a local
  // address, not resolvable).
  Result<int> Bind(const std::string& host, int port);

  // Accepts connections until Stop(), then waits for the open ones to end
  // (idle ones end at once; a request in a handler runs to its end).
  // REQUIRES: Bind() succeeded. Blocks the caller.
  void Serve();

  // Makes Serve() return. Thread-safe; idempotent; callable before Serve.
  void Stop();

  // Closes the connection of the request being handled once its response
  // is written. REQUIRES: called from a handler (the connection's thread).
  static void CloseAfterResponse();

  // True when the client of the request being handled has closed its end
  // of the connection (or reset it): nobody will read the response. A
  // client that only shut down its sending side counts as gone, as in
  // uvicorn. False outside a handler. Never blocks.
  static bool PeerClosed();

  // Connections accepted and not yet closed. Thread-safe.
  int num_open_connections() const { return num_open_.load(); }

 private:
  struct Tls;  // OpenSSL's context; declared in the .cc
  void ServeConnection(int fd);
  void RefuseBusy(int fd) const;

  const HttpListenerOptions options_;
  std::unique_ptr<Tls> tls_;
  std::unique_ptr<httplib::ThreadPool> pool_;  // max_connections threads
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: readable once Stop() was called
  std::atomic<bool> stopping_{false};
  std::atomic<int> num_open_{0};
  bool pool_joined_ = false;  // Serve's or the destructor's thread only
};

}  // namespace headway
