"""Synthetic-data generators for PANORAMIA: a small protocol, ``fit(data)`` then ``sample(n)``."""
