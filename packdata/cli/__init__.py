from packdata.cli.app import app, run  # noqa: F401 - the command line (packdata.__main__ runs it)
