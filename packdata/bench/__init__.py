"""Measuring input pipelines.

``packdata bench`` (:func:`packdata.bench.suite.run_bench`): ``inputs`` (what is read and the
loader knobs), ``models`` (built-ins and user models), ``runner`` (I/O alone, training alone, the
real loop), ``flops`` (FLOPs per sample and the target-GPU estimate), ``verdict`` (words and
advice from the numbers), ``sweep``, ``profile``, ``report``
(tables, JSON, plot) and ``timer`` (:class:`StepTimer`, public as ``packdata.StepTimer``).
``throughput`` and ``baselines`` serve ``packdata demo`` and the project's own benchmarks.
"""
