#!/usr/bin/env bash
# The benchmarks' peers as users install them: `pip install` of the versions pinned in
# bench/peers.txt (PyTorch's and CTranslate2's own wheels from PyPI) into a virtual environment
# outside the repository. Run it to print that environment's python; source it for peers_prepare.
# The environment is made once and remade when bench/peers.txt changes. About 3 GB: PyPI's torch
# wheel brings NVIDIA's CUDA libraries with it, as it does for every user who installs it.
#
#   bash bench/peers.sh            prints the python to run peers with (installing them first)
#   peers_prepare                  (sourced) sets peer_python and peer_versions ("torch 2.15.0, ...")
# env: PEERS_VENV (default ${XDG_CACHE_HOME:-~/.cache}/transformer-cpp/peers)
peers_prepare() {
  local repo venv pins
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/transformer-cpp/peers}
  pins="$repo/bench/peers.txt"
  case "$venv" in "$repo"/*) echo "error: PEERS_VENV must be outside the repository" >&2; return 1 ;; esac
  if ! cmp -s "$pins" "$venv/peers.txt" 2>/dev/null; then
    echo "peers: installing $(grep -v '^#' "$pins" | tr '\n' ' ')into $venv (once)" >&2
    if ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
      [[ $(id -u) == 0 ]] || { echo "error: python3-venv is missing (apt-get install python3-venv)" >&2; return 1; }
      apt-get install -y -q python3-venv >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null; } ||
        { echo "error: could not install python3-venv" >&2; return 1; }
    fi
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --disable-pip-version-check -r "$pins" >&2 &&
      cp "$pins" "$venv/peers.txt" ||
      { echo "error: installing the peers from PyPI failed (bench/peers.txt)" >&2; return 1; }
  fi
  peer_python="$venv/bin/python"
  peer_versions=$("$peer_python" -c '
import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "ctranslate2")))') ||
    { echo "error: the peers in $venv do not import" >&2; return 1; }
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  peers_prepare
  echo "$peer_python"
fi
