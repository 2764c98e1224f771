"""Object storage: how to reach it (:mod:`.storage`), datasets read from it (:mod:`.shards`:
the tar reader's shard source for a URL)
and input files read in place (:mod:`.files`). Writing to it is part of conversion
(:mod:`packdata.conversion.upload`)."""
