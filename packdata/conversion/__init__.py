"""Conversion: a source's inputs into a packed dataset.

- :mod:`.dispatch`: ``packdata.convert``, which settles the destination and the job once
  (:mod:`.job`), stages a URL's output around the one write (:mod:`.upload`) and writes here
  (:mod:`.local`) or in parts (:mod:`.parts`, on :mod:`.engines`: processes or Dask);
- :mod:`.pool`: the one process pool; every output is committed by :mod:`packdata.atomic`;
- :mod:`.costs`: what a conversion spent, phase by phase and process by process.

This package imports nothing itself, so that its modules import one another directly, never
through it (``packdata.convert`` and ``packdata.ConvertResult`` are the public names).
"""
