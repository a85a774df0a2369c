// The engine's one exception type: a message meant for the user, printed by the CLI as
// "error: <message>". Messages name the file (and line) they are about.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace tfm
