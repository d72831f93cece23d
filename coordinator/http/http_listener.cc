#include "coordinator/http/http_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace headway {

struct HttpListener::Tls {
  SSL_CTX* ctx = nullptr;
  ~Tls() { SSL_CTX_free(ctx); }
};

namespace {

using Clock = std::chrono::steady_clock;

// Set by CloseAfterResponse on the connection's own thread.
thread_local bool close_after_response = false;
// The socket of the connection whose request this thread handles; -1 outside one.
thread_local int current_fd = -1;

// Linux caps it at net.core.somaxconn. httplib's own is 5, which 32
// clients connecting at once overflowed.
constexpr int kListenBacklog = 1024;

// The oldest queued OpenSSL error as text, and the queue cleared.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// Waits until `fd` has `events` or `deadline` passes (false). With
// `stop_fd` >= 0, also false once it is readable.
bool WaitFor(int fd, short events, Clock::time_point deadline, int stop_fd = -1) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, int(std::min<int64_t>(left.count(), 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (stop_fd >= 0 && fds[1].revents != 0) return false;
    // An error or hang-up is "ready" too: the next read or write reports it.
    return true;
  }
}

std::string Ip(const sockaddr_storage& addr, int* port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    *port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    *port = ntohs(a->sin6_port);
  }
  return text;
}

// One accepted connection as httplib's Stream: a non-blocking socket, TLS
// over it when `ssl` is set, and the deadlines of the file comment. Reads
// are buffered: httplib reads request lines a byte at a time.
//
// httplib keeps every header line it reads, with no bound on their number:
// so that a fast client cannot fill memory before the 431 check sees the
// headers, a request's head (line and headers, up to the empty line) fails
// to read past kMaxRequestLineBytes + max_header_bytes.
class Connection final : public httplib::Stream {
 public:
  // httplib's CPPHTTPLIB_REQUEST_URI_MAX_LENGTH.
  static constexpr size_t kMaxRequestLineBytes = 8192;

  Connection(int fd, SSL* ssl, const HttpListenerOptions& options, int stop_fd)
      : fd_(fd),
        ssl_(ssl),
        options_(options),
        stop_fd_(stop_fd),
        read_deadline_(Clock::now() + options.read_timeout) {}
  ~Connection() override {
    if (ssl_ != nullptr) {
      if (handshaken_) SSL_shutdown(ssl_);  // best effort: one close_notify, no wait
      SSL_free(ssl_);
    }
    ::close(fd_);
  }

  // The TLS handshake, within the first request's read deadline.
  bool Handshake() {
    for (;;) {
      const int r = SSL_accept(ssl_);
      if (r == 1) return handshaken_ = true;
      const int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_WANT_READ && WaitFor(fd_, POLLIN, read_deadline_, stop_fd_)) continue;
      if (e == SSL_ERROR_WANT_WRITE && WaitFor(fd_, POLLOUT, read_deadline_, stop_fd_)) continue;
      ERR_clear_error();
      return false;
    }
  }

  // Waits up to `timeout` for the next request's first byte, then starts
  // its read deadline. False on timeout, on Stop() (`stop_fd`) or when the
  // client has closed.
  bool WaitForRequest(std::chrono::milliseconds timeout) {
    if (buffered() == 0 && (ssl_ == nullptr || SSL_pending(ssl_) == 0)) {
      if (!WaitFor(fd_, POLLIN, Clock::now() + timeout, stop_fd_)) return false;
    }
    read_deadline_ = Clock::now() + options_.read_timeout;
    head_bytes_ = 0;
    head_tail_ = 0;
    in_head_ = true;
    return true;
  }

  bool is_readable() const override {
    return buffered() > 0 || (ssl_ != nullptr && SSL_pending(ssl_) > 0) ||
           WaitFor(fd_, POLLIN, read_deadline_);
  }

  bool is_writable() const override {
    if (!WaitFor(fd_, POLLOUT, Clock::now() + options_.write_timeout)) return false;
    // A client that has closed its end reads as end-of-file here; one that
    // sent more data (a pipelined request) is still there.
    char byte;
    return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (buffered() == 0) {
      const ssize_t n = Receive(buffer_, sizeof(buffer_));
      if (n <= 0) return n;
      begin_ = 0;
      end_ = size_t(n);
    }
    const size_t n = std::min(size, buffered());
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    if (in_head_ && !CountHead(ptr, n)) {
      read_failed_ = true;
      return -1;
    }
    return ssize_t(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = Clock::now() + options_.write_timeout;
    for (;;) {
      if (ssl_ == nullptr) {
        const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) && WaitFor(fd_, POLLOUT, deadline)) continue;
        return -1;
      }
      const int n = SSL_write(ssl_, ptr, int(std::min<size_t>(size, 1 << 30)));
      if (n > 0) return n;
      if (!WaitTls(n, deadline)) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = Ip(addr, &port);
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = Ip(addr, &port);
  }

  socket_t socket() const override { return fd_; }

  // True once a read failed or ran past its deadline: httplib may still
  // have answered 400, but what follows on the connection is no request.
  bool read_failed() const { return read_failed_; }

 private:
  size_t buffered() const { return end_ - begin_; }

  // Counts `n` bytes handed to httplib as part of the request's head and
  // watches for its end. False once the head
  // outgrows its bound.
  bool CountHead(const char* bytes, size_t n) {
    for (size_t i = 0; i < n && in_head_; ++i) {
      head_tail_ = (head_tail_ << 8) | uint8_t(bytes[i]);
      // The empty line after the headers: "\r\n\r\n", "\n\n", "\r\n\n", "\n\r\n".
      if ((head_tail_ & 0xffffu) == 0x0a0au || (head_tail_ & 0xffffffu) == 0x0a0d0au) {
        in_head_ = false;
      }
    }
    head_bytes_ += n;
    return !in_head_ || head_bytes_ <= kMaxRequestLineBytes + size_t(options_.max_header_bytes);
  }

  // recv or SSL_read until data, end of file (0) or the read deadline (-1).
  ssize_t Receive(char* out, size_t size) {
    const ssize_t n = ReceiveOnce(out, size);
    if (n < 0) read_failed_ = true;
    return n;
  }

  ssize_t ReceiveOnce(char* out, size_t size) {
    for (;;) {
      if (ssl_ == nullptr) {
        const ssize_t n = ::recv(fd_, out, size, 0);
        if (n >= 0) return n;
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) &&
            WaitFor(fd_, POLLIN, read_deadline_, stop_fd_)) {
          continue;
        }
        return -1;
      }
      const int n = SSL_read(ssl_, out, int(size));
      if (n > 0) return n;
      if (SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN) return 0;
      if (!WaitTls(n, read_deadline_, stop_fd_)) return -1;
    }
  }

  // After an SSL_read/SSL_write that returned `r` <= 0: waits for what
  // OpenSSL wants; false for any other error or at `deadline`.
  bool WaitTls(int r, Clock::time_point deadline, int stop_fd = -1) {
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) return WaitFor(fd_, POLLIN, deadline, stop_fd);
    if (e == SSL_ERROR_WANT_WRITE) return WaitFor(fd_, POLLOUT, deadline, stop_fd);
    ERR_clear_error();
    return false;
  }

  const int fd_;
  SSL* const ssl_;  // owned; nullptr = plain HTTP
  const HttpListenerOptions& options_;
  const int stop_fd_;  // readable once the listener stops: reads give up
  bool handshaken_ = false;
  bool in_head_ = true;     // reading a request's line and headers
  size_t head_bytes_ = 0;   // of the head so far
  uint32_t head_tail_ = 0;  // its last four bytes
  bool read_failed_ = false;
  Clock::time_point read_deadline_;  // of the request being read
  char buffer_[16384];
  size_t begin_ = 0, end_ = 0;  // [begin_, end_) of buffer_ not yet read
};

}  // namespace

HttpListener::HttpListener(HttpListenerOptions options)
    : options_(std::move(options)),
      pool_(std::make_unique<httplib::ThreadPool>(size_t(options_.max_connections))),
      stop_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  // httplib writes these into its Keep-Alive response header.
  set_keep_alive_timeout(std::max<time_t>(1, options_.keep_alive_timeout.count() / 1000));
  set_keep_alive_max_count(1000);
}

HttpListener::~HttpListener() {
  Stop();
  if (!pool_joined_) pool_->shutdown();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

Status HttpListener::LoadTls() {
  if (options_.ssl_certfile.empty()) return Status::Ok();
  auto tls = std::make_unique<Tls>();
  tls->ctx = SSL_CTX_new(TLS_server_method());
  if (tls->ctx == nullptr) return Status::Internal("cannot create a TLS context: " + OpenSslError());
  SSL_CTX_set_min_proto_version(tls->ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(tls->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(tls->ctx, options_.ssl_certfile.c_str()) != 1) {
    return Status::InvalidArgument("cannot load the TLS certificate " + options_.ssl_certfile +
                                   " (a PEM certificate chain): " + OpenSslError());
  }
  if (SSL_CTX_use_PrivateKey_file(tls->ctx, options_.ssl_keyfile.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Status::InvalidArgument("cannot load the TLS private key " + options_.ssl_keyfile +
                                   " (an unencrypted PEM key): " + OpenSslError());
  }
  if (SSL_CTX_check_private_key(tls->ctx) != 1) {
    return Status::InvalidArgument("the TLS private key " + options_.ssl_keyfile +
                                   " does not match the certificate " + options_.ssl_certfile +
                                   ": " + OpenSslError());
  }
  tls_ = std::move(tls);
  return Status::Ok();
}

Result<int> HttpListener::Bind(const std::string& host, int port) {
  const std::string where = host + ":" + (port == 0 ? "(any port)" : std::to_string(port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return Status::Unavailable("cannot bind HTTP on " + where + ": " + gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, kListenBacklog) == 0) {
      listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return Status::Unavailable("cannot bind HTTP on " + where + ": " + error +
                               " (in use or not a local address)");
  }
  // httplib's streaming responses stop once svr_sock_ is invalid (its
  // "shutting down"): it must hold the listening socket while serving.
  svr_sock_ = listen_fd_;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  int bound_port = port;
  Ip(addr, &bound_port);
  return bound_port;
}

void HttpListener::Serve() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: let connections close rather than spin.
      if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 10);
      continue;
    }
    if (num_open_.load() >= options_.max_connections) {
      RefuseBusy(fd);
      continue;
    }
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));  // SSE chunks leave at once
    ++num_open_;
    pool_->enqueue([this, fd] {
      ServeConnection(fd);
      --num_open_;
    });
  }
  pool_->shutdown();
  pool_joined_ = true;
}

void HttpListener::Stop() {
  if (stopping_.exchange(true)) return;
  svr_sock_ = INVALID_SOCKET;  // streaming responses end (see Bind)
  const uint64_t one = 1;
  if (stop_fd_ >= 0 && ::write(stop_fd_, &one, sizeof(one)) < 0) {
    spdlog::warn("cannot wake the HTTP listener: {}", std::strerror(errno));
  }
}

void HttpListener::CloseAfterResponse() { close_after_response = true; }

bool HttpListener::PeerClosed() {
  if (current_fd < 0) return false;
  pollfd p{current_fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void HttpListener::RefuseBusy(int fd) const {
  if (tls_ == nullptr) {
    static const std::string body =
        R"({"error": {"message": "the server has too many open connections (coordinator.)"
        R"(http_max_connections); retry later", "type": "server_error", "param": null, )"
        R"("code": null}})";
    const std::string response =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" + body;
    // Best effort, never blocking the accepting thread: a new socket's send
    // buffer holds this.
    (void)!::send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
  }
  ::close(fd);
}

void HttpListener::ServeConnection(int fd) {
  SSL* ssl = nullptr;
  if (tls_ != nullptr) {
    ssl = SSL_new(tls_->ctx);
    if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
      SSL_free(ssl);
      ::close(fd);
      return;
    }
  }
  Connection connection(fd, ssl, options_, stop_fd_);
  if (ssl != nullptr && !connection.Handshake()) return;
  // A new connection has read_timeout to start its first request; each
  // request's deadline then runs from its first byte.
  std::chrono::milliseconds wait = options_.read_timeout;
  while (connection.WaitForRequest(wait)) {
    bool connection_closed = false;
    close_after_response = false;
    current_fd = fd;
    const bool ok = process_request(connection, /*close_connection=*/stopping_.load(),
                                    connection_closed, nullptr);
    current_fd = -1;
    if (!ok || connection_closed || close_after_response || connection.read_failed() ||
        stopping_) {
      break;
    }
    wait = options_.keep_alive_timeout;
  }
}

}  // namespace headway
