"""The version, written once (``duetime.__version__`` and the package metadata read it here)."""

__version__ = "0.2.0"
