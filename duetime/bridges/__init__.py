"""Bridges that let Celery and Dramatiq applications keep their delayed tasks in duetime.

Each bridge is installed once on the application's Celery app or Dramatiq broker; from then on a
task sent with a delay is stored in duetime instead of waiting in a worker's memory, and
``duetime run`` with a ``celery+…`` or ``dramatiq+…`` transport publishes it when it is due.
"""
