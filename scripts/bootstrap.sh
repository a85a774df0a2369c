#!/usr/bin/env bash
# Installs the Debian 12 packages needed to build and test transformer-cpp, idempotently:
# nothing is downloaded when everything is already installed. Run as root (or with sudo).
set -euo pipefail

packages=(cmake g++ make pkg-config libdnnl-dev libsentencepiece-dev libcli11-dev
          nlohmann-json3-dev libgtest-dev libbenchmark-dev libicu-dev libopenmpi-dev openmpi-bin
          libcpp-httplib-dev pybind11-dev python3-dev python3-pytest "$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
