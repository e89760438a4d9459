"""Sub-commands of ``lightning-privacy``, one module each (see :mod:`lightning_privacy.cli`)."""
