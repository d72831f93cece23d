// Hostile bytes for a listening port, for tests of what a server does with
// input no client of its own would send.
#pragma once

namespace headway::testing {

// Opens 8 TCP connections to 127.0.0.1:`port` one after another, writes
// 256 B to 16 KiB of seeded random bytes on each, the last a ZMTP 3.0
// greeting asking for the NULL mechanism, and closes each after 20 ms.
// Connections the server refuses or resets are not errors.
void SendTcpGarbage(int port);

}  // namespace headway::testing
