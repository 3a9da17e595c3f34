// A fatal signal or an uncaught exception leaves its reason and the stack in
// the process's log (stderr) before the process dies as it would have:
//
//   F tandem-operator: fatal signal 11 (Segmentation fault) in thread 4242
//   F tandem-operator: stack (addr2line -Cfpe <binary> <offset> names a frame):
//   /usr/bin/tandem-operator(+0x1a2b3c)[0x55d0c01a2b3c]
//   ...
//
// The frames name the binary and the offset in it, which `addr2line` turns
// into a function and line with the same build's binary. Handlers run on an
// alternate signal stack in the thread that installs them (a stack overflow
// in that thread is reported too); another thread's overflow dies without a
// report. After the report the signal's default action runs: the exit status
// and any core dump are what they were without it.
#pragma once

namespace tandem {

// Installs the handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) and the
// terminate handler; `program` prefixes the report's lines. Call once, early
// in main, before other threads start.
void installCrashReport(const char* program);

}  // namespace tandem
