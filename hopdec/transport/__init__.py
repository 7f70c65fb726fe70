"""Moving the cores' messages between processes: the message layout (:mod:`.message`), the Hop workers' MPI
point-to-point on flat buffers (:mod:`.mpi`), the parameter server's messages (:mod:`.ps`), bounded
collectives (:mod:`.collectives`), the one poll-with-timeout loop every wait uses (:mod:`.waiting`), and
going on after a failure (:mod:`.ulfm`)."""
