#!/usr/bin/env bash
# The README's two commands on a fresh machine: a container of Debian 12 (Python 3.11) or 13
# (Python 3.13) with only Python and git (made here by debootstrap, run by podman with runc), the
# repository copied in, on a private
# network (slirp4netns: the package index and Debian's mirror answer, this machine's servers do
# not). `bash scripts/demo.sh` must pass, then `bash scripts/test.sh` must install and start every
# server and program the suite needs and pass with nothing skipped.
#
#   bash scripts/test-fresh-machine.sh                      # the whole suite (about 30 minutes)
#   bash scripts/test-fresh-machine.sh tests/acceptance/test_install.py ...   # only these tests
#   bash scripts/test-fresh-machine.sh --release trixie [tests ...]         # Debian 13 (default bookworm)
#
# Needs root (rootful podman), debootstrap and Debian's mirror the first time (the base is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
release=bookworm
if [ "${1:-}" = "--release" ]; then
  release="${2:?--release needs a Debian release name: bookworm (12) or trixie (13)}"
  shift 2
fi
case "$release" in
  bookworm | trixie) ;;
  *) echo "--release $release: give bookworm (Debian 12) or trixie (Debian 13)" >&2; exit 2 ;;
esac
image="localhost/duetime-fresh:$release"
podman=(podman --runtime runc)
for need in podman runc debootstrap slirp4netns; do
  command -v "$need" >/dev/null && continue
  echo "== installing $need (for the fresh machine's container)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$need" >/dev/null
done
if ! "${podman[@]}" image exists "$image"; then
  root=$(mktemp -d /var/tmp/duetime-fresh-root.XXXXXX)
  echo "== making $image with debootstrap (Debian $release: python3, venv, git; about a minute)"
  # bookworm's keyring holds trixie's keys too: one debootstrap makes either
  debootstrap --variant=minbase --include=python3,python3-venv,git,ca-certificates "$release" "$root" \
    http://deb.debian.org/debian >/dev/null
  tar -C "$root" -c . | "${podman[@]}" import - "$image" >/dev/null
  rm -rf "$root"
fi
# The repository as a clone would hold it: the files git tracks or would add (not what it ignores).
copy=$(mktemp -d /var/tmp/duetime-fresh.XXXXXX)
trap 'rm -rf "$copy"' EXIT
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy"
git -C "$copy" init -q && git -C "$copy" add -A \
  && git -C "$copy" -c user.name=fresh -c user.email=fresh@localhost commit -qm "as cloned"
log="${FRESH_LOG:-/var/tmp/duetime-fresh-machine-$release.log}"
echo "== the README's two commands in $image (output in $log)"
start=$(date +%s)
set +e
# --privileged: root in the container may do what root on a machine may (the suite mounts a small
# tmpfs and makes files immutable with chattr); the network stays its own.
"${podman[@]}" run --rm --privileged --network slirp4netns \
  --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  -v "$copy:/duetime" -w /duetime "$image" \
  bash -c 'python3 --version && bash scripts/demo.sh --messages 2000 && bash scripts/test.sh "$@"' bash "$@" \
  2>&1 | tee "$log"
code=${PIPESTATUS[0]}
set -e
echo "== fresh machine: exit $code after $(( $(date +%s) - start )) s"
[ "$code" = 0 ] || exit "$code"
summary=$(grep -E "^=+ .*(passed|failed).* in " "$log" | tail -1)
echo "== $summary"
if grep -qE "[0-9]+ (skipped|failed|error)" <<<"$summary"; then
  echo "the suite skipped or failed tests on a fresh machine: see $log" >&2
  exit 1
fi
