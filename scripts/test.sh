#!/usr/bin/env bash
# The second command of the README: set up, lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,postgres,mysql,rabbitmq,redis,nats,spark,celery,dramatiq,metrics
echo "== ruff"
.venv/bin/ruff check duetime tests bench
.venv/bin/ruff format --check duetime tests bench
echo "== mypy (strict)"; .venv/bin/mypy
echo "== import layers (import-linter, contracts in pyproject.toml)"; .venv/bin/lint-imports --no-cache
echo "== pytest"; .venv/bin/python -m pytest "$@"
