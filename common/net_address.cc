#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <string_view>

namespace headway {
namespace {

std::string Quoted(const std::string& text) { return "\"" + text + "\""; }

// The numeric text of an IPv4 or IPv6 socket address; "" for other families.
std::string NumericHost(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof text);
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
              sizeof text);
  }
  return text;
}

}  // namespace

bool IsWildcardHost(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "*";
}

Status CheckHostSyntax(const std::string& key, const std::string& host, bool allow_wildcard) {
  const char* allowed = allow_wildcard
                            ? "an IP address, a host name, or 0.0.0.0 / :: for every interface"
                            : "an IP address or host name that peers can dial (not a wildcard "
                              "such as 0.0.0.0)";
  if (host.empty()) {
    return Status::InvalidArgument("`" + key + "` = \"\" is not allowed: must be " + allowed);
  }
  if (host == "*" || (!allow_wildcard && IsWildcardHost(host))) {
    return Status::InvalidArgument("`" + key + "` = " + Quoted(host) + " is not allowed: must be " +
                                   allowed);
  }
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_' || c == ':';
    if (!ok) {
      return Status::InvalidArgument("`" + key + "` = " + Quoted(host) +
                                     " is not allowed: must be " + allowed +
                                     " (no scheme, port, brackets or spaces)");
    }
  }
  // A colon belongs to an IPv6 literal only; "10.0.0.1:80" carries a port.
  in6_addr ipv6{};
  if (host.find(':') != std::string::npos && inet_pton(AF_INET6, host.c_str(), &ipv6) != 1) {
    return Status::InvalidArgument("`" + key + "` = " + Quoted(host) +
                                   " is not allowed: must be " + allowed +
                                   " (no scheme, port, brackets or spaces)");
  }
  return Status::Ok();
}

Result<std::string> ResolveHost(const std::string& key, const std::string& host) {
  if (IsWildcardHost(host)) return host == "*" ? std::string("0.0.0.0") : host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::InvalidArgument("`" + key + "` = " + Quoted(host) + " does not resolve (" +
                                   gai_strerror(rc) +
                                   "): must be an IP address or a host name this machine "
                                   "resolves");
  }
  std::string ipv4, ipv6;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET && ipv4.empty()) ipv4 = NumericHost(a->ai_addr);
    if (a->ai_family == AF_INET6 && ipv6.empty()) ipv6 = NumericHost(a->ai_addr);
  }
  freeaddrinfo(found);
  if (!ipv4.empty()) return ipv4;
  if (!ipv6.empty()) return ipv6;
  return Status::InvalidArgument("`" + key + "` = " + Quoted(host) +
                                 " resolves to no IPv4 or IPv6 address: must be an IP address "
                                 "or a host name this machine resolves");
}

std::string InterfaceOf(const std::string& ip) {
  if (ip.empty() || IsWildcardHost(ip)) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  // Linux's loopback interface answers for all of 127.0.0.0/8, though it
  // lists only 127.0.0.1.
  in_addr v4{};
  const bool loopback_v4 =
      inet_pton(AF_INET, ip.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
  std::string name;
  for (const ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
    if (NumericHost(i->ifa_addr) == ip) name = i->ifa_name;
    if (loopback_v4 && i->ifa_addr->sa_family == AF_INET &&
        (ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr) >> 24) == 127) {
      name = i->ifa_name;
    }
  }
  freeifaddrs(list);
  return name;
}

std::string ZmqTcpHost(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.rfind(kTcp, 0) != 0) return "";
  std::string rest = endpoint.substr(kTcp.size());
  // A connect endpoint may name its source first: "tcp://src;dst:port".
  if (size_t semi = rest.find(';'); semi != std::string::npos) rest = rest.substr(semi + 1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace headway
