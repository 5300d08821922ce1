"""What a running dispatcher tells operators: Prometheus metrics, the probe server (``/healthz``,
``/readyz``), heartbeats of the live dispatchers, logs a machine can ingest, the delivery log.
"""
