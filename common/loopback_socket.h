// Blocking TCP sockets on 127.0.0.1 for the programs that act as raw peers of
// our servers: tests and tandem-bench clients that leave at a chosen byte or
// reset the connection, proxies that cut a stream, holders of a port. The
// servers themselves use Boost.Asio; nothing here is on a serving path.
//
// Every descriptor is opened close-on-exec, so a child started meanwhile does
// not keep it (clear FD_CLOEXEC with fcntl to model a socket that lacks it).
// Functions return -1 where they cannot do what they say, with errno set by
// the call that failed.
#pragma once

#include <netinet/in.h>

#include <string_view>

namespace tandem {

// The address 127.0.0.1:port (port 0: any free port, for bind).
sockaddr_in loopbackAddress(int port);

// A socket connected to 127.0.0.1:port, or -1.
int connectLoopback(int port);

// A socket listening on 127.0.0.1 at a port the kernel chose, which is stored
// in *port; -1 (and *port untouched) on failure.
int listenLoopback(int* port, int backlog = 64);

// A port on 127.0.0.1 that was free a moment ago (bound, read back and
// released), for a server started as another process; -1 on failure. Another
// process may take it before the caller does.
int freeLoopbackPort();

// Sends every byte (MSG_NOSIGNAL: a closed peer is a false return, not a
// SIGPIPE); false once a send fails or the peer is gone.
bool sendAll(int fd, std::string_view bytes);

// Closes with an RST instead of a FIN: SO_LINGER {on, 0 s}, then close().
void resetAndClose(int fd);

}  // namespace tandem
