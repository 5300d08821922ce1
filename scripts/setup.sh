#!/usr/bin/env bash
# Create .venv (if needed) and install duetime into it, with the extras named in $1 (e.g. "dev").
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.installed-${extras:-base}"
# the version is package metadata too: a new one in duetime/version.py reinstalls
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] \
  || [ duetime/version.py -nt "$stamp" ]; then
  target="."
  [ -n "$extras" ] && target=".[$extras]"
  # constraints.txt pins every version the suite last passed with (tools and drivers alike)
  # setuptools' editable install warns that a folder named like the package may shadow it: the
  # folder is the package itself, so the warning says nothing to a user and is kept quiet
  PYTHONWARNINGS="ignore::Warning:setuptools.command.editable_wheel" \
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e "$target"
  touch "$stamp"
fi
