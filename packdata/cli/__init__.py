"""The ``packdata`` command line (``packdata.__main__`` starts it)."""

from packdata.cli.app import app, run  # noqa: F401 - the command line's entry points
