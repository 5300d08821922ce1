#!/usr/bin/env bash
# The documentation site: `bash scripts/docs.sh build` writes it to site/ (strict: a broken link or
# anchor, or a page outside the navigation, fails the build); `bash scripts/docs.sh serve` serves it
# at http://127.0.0.1:8000 and rebuilds it as the pages change.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh docs
export NO_MKDOCS_2_WARNING=1
case "${1:-build}" in
  build) exec .venv/bin/mkdocs build --strict ;;
  serve) exec .venv/bin/mkdocs serve --strict ;;
  *) echo "usage: bash scripts/docs.sh [build|serve]" >&2; exit 2 ;;
esac
