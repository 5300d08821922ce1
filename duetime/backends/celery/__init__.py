"""Celery broker transport (extra: ``duetime[celery]``): publishes tasks the Celery bridge stored."""
