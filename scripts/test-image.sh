#!/usr/bin/env bash
# CI's second step: the container image built from deploy/Dockerfile and run as an operator runs
# it (tests/image). Needs root (rootful podman) and, the first time, Debian's mirror for the base.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh dev,postgres,rabbitmq
# podman with runc (crun does not run on these machines' cgroups) and debootstrap (the base image)
for need in podman runc debootstrap; do
  command -v "$need" >/dev/null && continue
  echo "== installing $need (for the container image's tests)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$need" >/dev/null
done
bash scripts/image-base.sh
echo "== pytest (the container image)"
.venv/bin/python -m pytest -m image tests/image "$@"
