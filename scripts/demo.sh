#!/usr/bin/env bash
# The first command of the README: set up, then run `duetime demo` on the embedded SQLite store.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/duetime demo "$@"
