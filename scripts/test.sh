#!/usr/bin/env bash
# The second command of the README: set up, lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,docs,postgres,mysql,rabbitmq,redis,nats,spark,celery,dramatiq,metrics,dashboard,otel
# System programs the tests use, from Debian's packages: Chromium drives the dashboard's browser
# tests (Playwright never downloads a browser here); chattr (e2fsprogs) makes files nobody may
# change, root included, for the tests of files a user may only read.
for need in "chromium chromium the dashboard's browser tests" "chattr e2fsprogs the read-only file tests" \
  "faketime faketime the tests of a host clock that is wrong" \
  "promtool prometheus the alert rules' tests (promtool, and a real Prometheus)"; do
  read -r program package why <<<"$need"
  command -v "$program" >/dev/null && continue
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing $package (for $why)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
  else
    echo "$why need $program: sudo apt-get install $package" >&2
  fi
done
echo "== ruff"
.venv/bin/ruff check duetime tests bench docs/examples docs/hooks
.venv/bin/ruff format --check duetime tests bench docs/examples docs/hooks
echo "== mypy (strict)"; .venv/bin/mypy && .venv/bin/mypy --strict docs/examples
echo "== import layers (import-linter, contracts in pyproject.toml)"; .venv/bin/lint-imports --no-cache
# Three workers, each test file whole on one of them (a file's shared fixtures stay shared): most
# tests wait on servers, timers and subprocesses, so three fit two cores. DUETIME_TEST_WORKERS=0
# runs everything in this process.
workers="${DUETIME_TEST_WORKERS:-3}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
echo "== pytest"; .venv/bin/python -m pytest "${parallel[@]}" "$@"
