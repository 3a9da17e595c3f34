// How every tandem program reads its command line: CLI11 parses it, and a
// usage error reads the same in each, in the program's own words.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace tandem {

// The exit status of a command line refused (as argparse's and getopt's
// programs exit; CLI11's own statuses were 104-114, one per error kind).
inline constexpr int kUsageExitStatus = 2;

// Parses `argc`/`argv` into `app`. Returns nothing when the program is to
// run; otherwise the status to exit with: 0 after --help (the help of the
// subcommand given, if any), kUsageExitStatus after a usage error, said on
// stderr as "<program>: <what>" (usageErrorText) and where the options are
// listed.
std::optional<int> parseCommandLine(CLI::App& app, int argc, const char* const* argv,
                                    const std::string& program);

// The message for a command line CLI11 refused (what parseCommandLine
// prints after "<program>: "), naming every word left over whatever CLI11
// refused first (a required option missing is often one misspelt): an
// option the command given does not know, with the closest one it knows
// ("did you mean"); one it knows but given before it; a word where a
// command goes, with the closest command; another word, as not taken (one
// right after an option not known is taken for its value). A command
// missing lists those there are. Otherwise CLI11's own message.
std::string usageErrorText(const CLI::App& app, const CLI::ParseError& error);

}  // namespace tandem
