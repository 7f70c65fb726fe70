"""The Hop protocol core (Luo et al., *Hop: Heterogeneity-aware Decentralized Training*), sans I/O.

* :mod:`.config` -- the protocol settings (Table 1's rows, mechanisms) and their validation;
* :mod:`.protocols` -- the ``--protocol`` registry: how workers bound their gap (sec. 3.3, 4.1, 4.2);
* :mod:`.worker` -- one worker as a state machine: events in, actions (:mod:`.actions`) out;
* :mod:`.update_queue` -- update queues (sec. 4.1, 6.1);
* :mod:`.token_queue` -- token queues and notify-ack ACKs (sec. 4.2, 3.3);
* :mod:`.receive` -- which updates Recv waits for and how Reduce weighs them (sec. 4.3, 4.4);
* :mod:`.cuts` -- where a run checkpoints and stops (consistent cuts at Enter(K));
* :mod:`.heal` -- the survivors' cores reconfigured to the healed graph (``--fault-tolerance``).

No MPI, no torch, no clock: :mod:`hopdec.runtime.hop_loop` carries out the actions over MPI, and
:mod:`hopdec.sim` in-process.
"""
