// The "gloo" backend of Communicator (comm/communicator.h): Gloo's TCP
// transport, for CPU ranks on any hosts. Internal to comm/; keeps Gloo's
// headers out of communicator.h.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace headway {

// Connects a full mesh of TCP pairs among options.size ranks: each rank
// listens on GlooListenAddress(options) (port chosen by the OS) and
// publishes that address in `store` under "<key_prefix>/gloo/<rank>".
// `store` is only used during this call. Size 1 opens no sockets.
//
// AllReduceSum uses Gloo's ring all-reduce (reduce-scatter, then all-gather):
// every element is summed once, on one rank, and the sum is copied to the
// others, so all ranks end bit-identical; the order of the summands differs
// between elements, so the result may differ from a rank-ordered sum in the
// last bits.
//
// Gloo writes to its sockets with writev(2): a process using this backend
// must ignore SIGPIPE (in main), or a peer that dies kills it.
//
// Not thread-safe: one thread calls the collectives. Errors: Unavailable
// naming "gloo", the operation and Gloo's message; those of
// GlooListenAddress.
// The IP a gloo rank listens on and publishes: options.advertise_host,
// resolved. Gloo cannot bind one address and publish another: its TCP
// device (gloo::transport::tcp::attr, gloo 0.0~git20220518) takes one
// address, `hostname` or the address of `iface`, binds it, looks up the
// interface that holds it (refusing 0.0.0.0), and publishes the listener's
// bound address; each pair then picks its connecting side by comparing its
// own bound address with the peer's published one, so rewriting published
// addresses would break that agreement. So a wildcard options.bind_host
// means "listen on the advertised address", and a specific one must resolve
// to that same address. The port is the OS's choice (Gloo has no port
// option). Errors: InvalidArgument when a host does not resolve, the
// advertised host is a wildcard or on no interface of this host (a NAT
// address), or a specific bind host differs from it.
Result<std::string> GlooListenAddress(const CommunicatorOptions& options);

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommunicatorOptions& options,
                                                             RendezvousStore& store);

}  // namespace headway
