// The engine's one exception type: a message meant for the user, printed by the CLI as
// "error: <message>". Messages name the file (and line) they are about.
#pragma once

#include <stdexcept>
#include <string>

namespace tfm {

struct Error : std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tfm
