#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: packages, build, then CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The browser test of serve's web page needs chromium, its driver and Selenium.
bash scripts/bootstrap.sh chromium chromium-driver python3-selenium
bash scripts/build.sh
ctest --test-dir build --output-on-failure
