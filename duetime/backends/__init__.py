"""Backends: one folder each; they import the core and their own driver, never each other."""
