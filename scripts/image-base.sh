#!/usr/bin/env bash
# The base image deploy/Dockerfile starts FROM (python:3.11-slim), made on this machine when no
# registry can be reached: Debian bookworm with Python 3.11 from Debian's own packages, by
# debootstrap, imported into podman under the Dockerfile's name. Made once; kept in podman's store.
set -euo pipefail
name="docker.io/library/python:3.11-slim"
podman image exists "$name" && { echo "base image $name: present"; exit 0; }
root=$(mktemp -d /var/tmp/duetime-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "== making $name with debootstrap (Debian bookworm, python3; a minute or two)"
debootstrap --variant=minbase --include=python3-venv,python3-pip,ca-certificates bookworm "$root" \
  http://deb.debian.org/debian >/dev/null
# python:3.11-slim has `python` and `pip` on its PATH; Debian's names them python3 and pip3
ln -sf python3 "$root/usr/bin/python"
tar -C "$root" -c . | podman import --change 'CMD ["python3"]' - "$name" >/dev/null
echo "base image $name: made"
