"""The tgc version (the cache keys and `tgc --version` use it); base layer, imports nothing."""

__version__ = "0.1.0"
