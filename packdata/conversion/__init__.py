"""Conversion: a source's inputs into a packed dataset.

- :mod:`.dispatch`: ``packdata.convert``, which settles the job once (:mod:`.job`) and runs it
  here (:mod:`.local`), in parts (:mod:`.parts`, on :mod:`.engines`: processes or Dask) or
  towards object storage (:mod:`.upload`);
- :mod:`.pool`: the one process pool; every output is committed by :mod:`packdata.atomic`.

This package imports nothing itself, so that its modules import one another directly, never
through it (``packdata.convert`` and ``packdata.ConvertResult`` are the public names).
"""
