// The engine's one exception type: a message meant for the user, printed by the CLI as
// "error: <message>". Messages name the file (and line) they are about.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tfm {

struct Error : std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A command line that cannot run as given — an option's value or a combination of options
// (`--nbest 5 --beam 2`, `--max-memory abc`): printed the same way, exit status 2 (a usage
// error, as CLI11's parse errors) where Error's is 1.
struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(message) {}
};

// A name read from a file (a tensor or variable name, a token, a directory entry), quoted for an
// error message: in double quotes, `"` and `\` escaped, every byte that is not printable ASCII or
// part of well-formed UTF-8 (a NUL, a control byte, a stray byte of a damaged file) as \xNN, and
// at most `max_bytes` of it before "..." and its length, so a message is never cut by a NUL,
// never ends in a raw byte, and stays one line.
std::string quoted_for_message(std::string_view bytes, size_t max_bytes = 80);

}  // namespace tfm
