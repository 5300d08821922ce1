#!/usr/bin/env bash
# The second command of the README: set up, lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,docs,postgres,mysql,rabbitmq,redis,nats,spark,celery,dramatiq,metrics,dashboard,api,otel,webhooks,mqtt,encryption
# The servers and programs the tests talk to and run (PostgreSQL, MariaDB, Redis, RabbitMQ, NATS,
# Java 17 or newer, Chromium, ...): each found, installed from Debian's packages when this runs as root, and
# started when it does not answer; scripts/services.py says how, and where the tests find each.
# Bytecode for every module, written once: the suite starts the CLI in hundreds of processes, and
# where PYTHONDONTWRITEBYTECODE is set each of them would otherwise compile the package anew.
.venv/bin/python -m compileall -q duetime tests >/dev/null
echo "== servers and programs the tests need"
.venv/bin/python scripts/services.py
services_env="${DUETIME_SERVICES_DIR:-/var/tmp/duetime-services}/env"
# shellcheck disable=SC1090
[ -f "$services_env" ] && . "$services_env"
echo "== ruff"
.venv/bin/ruff check duetime tests bench docs/examples docs/hooks
.venv/bin/ruff format --check duetime tests bench docs/examples docs/hooks
echo "== mypy (strict)"; .venv/bin/mypy && .venv/bin/mypy --strict docs/examples
echo "== import layers (import-linter, contracts in pyproject.toml)"; .venv/bin/lint-imports --no-cache
# Six workers, each test file whole on one of them (a file's shared fixtures stay shared), the
# longest files first (tests/file-seconds.json) and no more than two Spark files side by side:
# most tests wait on servers, timers and subprocesses, so six keep two cores busy for the whole run
# (here: 12-13 minutes for 2,296 tests). The CPU is what limits it: a new `duetime` process costs
# about 0.3 CPU-seconds (the tests' short commands are forked instead, as tests/cli_server.py
# says), a Spark job's JVM about 10 (started as tests/spark_jvm.py says).
# DUETIME_TEST_WORKERS=0 runs everything in this process.
workers="${DUETIME_TEST_WORKERS:-6}"
parallel=()
# --max-worker-restart=0: a worker that dies (pytest-timeout ends a test that runs over by ending
# its worker) ends the run with that test named; pytest-xdist 3.8 replaces the worker, then can
# wait for ever on the finished tests of the dead worker's files (a known pytest-xdist bug).
# --no-loadscope-reorder: pytest-xdist otherwise hands out the files with the most tests first,
# undoing the longest-first order (a long file of few tests, started last, held the run's end).
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder --max-worker-restart=0)
echo "== pytest"; .venv/bin/python -m pytest "${parallel[@]}" "$@"
