"""The ``packdata`` command line (``packdata.__main__`` starts it): :mod:`.app` holds what the
commands share, :mod:`.convert`, :mod:`.datasets` and :mod:`.bench` the commands."""

# ruff: noqa: I001 - imported in the order `packdata --help` lists the commands
from packdata.cli import convert, datasets, bench  # noqa: F401 - each registers its commands
from packdata.cli.app import app, run

__all__ = ["app", "run"]
