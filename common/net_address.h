// Host addresses of network endpoints: the checks a config applies to an
// address it cannot resolve yet (it may name another machine), and the
// resolution a process applies to its own addresses where a library needs
// an IP (Gloo publishes a socket address; UCX picks network devices).
// Errors name the key the address came from, the value and what is allowed.
#pragma once

#include <string>

#include "common/status.h"

namespace headway {

// True for the addresses that mean "every interface" when bound: 0.0.0.0,
// :: and ZeroMQ's *. Peers cannot dial them.
bool IsWildcardHost(const std::string& host);

// Checks the form of `host` (an IPv4 or IPv6 literal, or a DNS name:
// letters, digits, '-', '.', '_'; IPv6 literals without brackets). With
// `allow_wildcard` false, a wildcard is refused as something peers cannot
// dial. Resolves nothing. Errors: InvalidArgument naming `key`.
Status CheckHostSyntax(const std::string& key, const std::string& host, bool allow_wildcard);

// Resolves `host` (an IP literal or a name, getaddrinfo) to one numeric IP
// address, IPv4 preferred (the loopback and pod addresses Headway binds are
// IPv4; "localhost" may list ::1 first). A wildcard comes back as is.
// Errors: InvalidArgument "`key` = "host" does not resolve (...)" naming
// what is allowed. Blocks for as long as the resolver does.
Result<std::string> ResolveHost(const std::string& key, const std::string& host);

// The name of the local network interface that holds `ip` (a numeric
// address, as ResolveHost returns), e.g. "lo" for 127.0.0.1 and every
// other 127.0.0.0/8 address; "" when no interface holds it (a NAT or
// load-balancer address) or on a wildcard.
std::string InterfaceOf(const std::string& ip);

// The host part of a ZeroMQ tcp:// endpoint ("tcp://h:5557" -> "h",
// "tcp://[::1]:5557" -> "::1"); "" for any other transport or form.
std::string ZmqTcpHost(const std::string& endpoint);

}  // namespace headway
