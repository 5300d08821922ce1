#!/usr/bin/env bash
# The second command of the README: set up, lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,postgres,mysql,rabbitmq,redis,nats,spark,celery,dramatiq,metrics,dashboard,otel
# The dashboard tests drive Debian's Chromium (Playwright never downloads a browser here).
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium (for the dashboard's browser tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "the dashboard tests need Chromium: sudo apt-get install chromium" >&2
  fi
fi
echo "== ruff"
.venv/bin/ruff check duetime tests bench
.venv/bin/ruff format --check duetime tests bench
echo "== mypy (strict)"; .venv/bin/mypy
echo "== import layers (import-linter, contracts in pyproject.toml)"; .venv/bin/lint-imports --no-cache
# Three workers, each test file whole on one of them (a file's shared fixtures stay shared): most
# tests wait on servers, timers and subprocesses, so three fit two cores. DUETIME_TEST_WORKERS=0
# runs everything in this process.
workers="${DUETIME_TEST_WORKERS:-3}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
echo "== pytest"; .venv/bin/python -m pytest "${parallel[@]}" "$@"
