"""The package's version, in one place (the face and resume states read it)."""

__version__ = "0.1.0"
