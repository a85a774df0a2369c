"""The Python of the peers' environment, for the scripts that run a peer through it
(ctranslate2_speed.py, ctranslate2_sampling.py, ctranslate2_compare.py): bash bench/peers.sh
installs the wheels pinned in bench/peers.txt into a venv outside the repository on first use
and prints its python. Scripts run as `python3 bench/X.py` have bench/ on sys.path, so
`from peer_python import peer_python` finds this file."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peer_python():
    """The peers' python (installing them first where they are not there); exits with one
    error line where bench/peers.sh fails."""
    result = subprocess.run(["bash", os.path.join(ROOT, "bench", "peers.sh")],
                            stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit("error: bench/peers.sh could not install the peers")
    return result.stdout.strip()
