"""qnnctl's version: a leaf module, so that reading it imports nothing else of qnnctl."""

__version__ = "0.1.0"
