#!/usr/bin/env bash
# CI's third step: production topologies each test starts on its own ports and directories and
# removes (tests/topology): PgBouncer in transaction mode, a PostgreSQL primary with a standby that
# takes over, a RabbitMQ cluster, a NATS cluster, Redis under Sentinel, dispatchers on hosts of
# their own (network namespaces). The shared servers are never touched. Needs root (PostgreSQL
# and PgBouncer run as `postgres`, the RabbitMQ nodes as `rabbitmq`, namespaces need root).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh dev,postgres,mysql,rabbitmq,redis,nats,spark,celery,dramatiq,metrics,dashboard,otel
for need in "pgbouncer pgbouncer" "pg_basebackup postgresql-client" "redis-sentinel redis-sentinel" \
  "ip iproute2" "nats-server nats-server" "rabbitmq-server rabbitmq-server"; do
  read -r program package <<<"$need"
  command -v "$program" >/dev/null || [ -x "/usr/lib/postgresql/15/bin/$program" ] && continue
  echo "== installing $package (for the topology tests)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
done
echo "== pytest (production topologies)"
.venv/bin/python -m pytest -m topology tests/topology "$@"
