"""Object storage: how to reach it (:mod:`.storage`), datasets read from it (:mod:`.tar_reader`)
and input files read in place (:mod:`.files`). Writing to it is part of conversion
(:mod:`packdata.conversion.upload`)."""
