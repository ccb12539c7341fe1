"""The package's version, written from package.json's at every build."""

__version__ = "0.1.0"
