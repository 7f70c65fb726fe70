"""Moving the cores' messages between processes: the message layout (:mod:`.message`), MPI point-to-point
on flat buffers (:mod:`.mpi`), and the one poll-with-timeout loop every wait uses (:mod:`.waiting`)."""
