"""The read side: a packed dataset as torch sees it, the order of its batches, and how they reach
the training loop.

- :mod:`.dataset`: ``PackedDataset`` (any container; ``LMDBDataset`` and friends pin one),
  map-style and batched; :mod:`.rows` what its ``__getitems__`` hands a stock DataLoader;
  :mod:`.transfer` how batches leave DataLoader worker processes;
- :mod:`.sampling`: seeded, rank-aware, resumable batch samplers; :mod:`.order` DataLoader's
  ``batch_size``/``shuffle``/``sampler``/``batch_sampler`` turned into one of them;
- :mod:`.loader`: ``packdata.loader`` and the ``Loader`` it returns; :mod:`.device` batches on
  the device; :mod:`.resident` the whole dataset held in memory;
- :mod:`.streaming` and :mod:`.streamloader`: shard-ordered iteration with a shuffle buffer;
- :mod:`.collate`: pad and pack collate for token sequences; :mod:`.resume` resumable state.

This package imports nothing itself, so that its modules import one another directly, never
through it (``packdata.open``, ``packdata.loader`` and the other public names are the face's).
"""
