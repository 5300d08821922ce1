"""What users give, read and checked once: queue and endpoint names, URLs (their options, and
the one rule that hides their secrets), durations and times.
"""
