"""The torch side of a worker: datasets and shards (:mod:`.data`), models (:mod:`.models`), and the
flat-buffer trainer (:mod:`.trainer`). No MPI here."""
