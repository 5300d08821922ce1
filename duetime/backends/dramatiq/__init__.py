"""Dramatiq broker transport (extra: ``duetime[dramatiq]``): enqueues messages the Dramatiq bridge stored."""
