"""Communication graphs for decentralized training, after Hop (Luo et al., ASPLOS'19).

A topology is a weighted ``networkx.DiGraph`` (node ``i`` = MPI rank ``i``, edge ``i -> j`` = i sends
its parameters to j with weight ``W[i, j]``). The package is split by concept:

* :mod:`.graph_io` -- read, validate and write topology files;
* :mod:`.generators` -- ring, ring-based, double-ring, hierarchical, exponential, torus, complete;
* :mod:`.weights` -- the mixing matrix W and its stochasticity;
* :mod:`.spectral` -- spectral gaps (Hop footnote 2, Fig. 21);
* :mod:`.bounds` -- Hop Table 1: iteration-gap bounds and queue capacities;
* :mod:`.analysis` -- the figures ``hopdec topo analyze`` reports.

Everything is re-exported here, so ``from hopdec import topology as T; T.ring(8)`` works.

>>> G = ring(8)
>>> is_doubly_stochastic(mixing_matrix(G)), diameter(G)
(True, 4)
"""

import networkx as nx  # noqa: F401  (``T.nx`` is used by callers)

from hopdec.topology.bounds import (diameter, gap_bounds, max_gap_bound, path_lengths,  # noqa: F401
                                    token_queue_capacity, update_queue_capacity,
                                    update_queue_capacity_no_tokens)
from hopdec.topology.generators import (GENERATORS, HIERARCHICAL_VARIANTS, complete,  # noqa: F401
                                        default_machine_sizes, default_topology, double_ring,
                                        exponential, hierarchical, ring, ring_based, torus)
from hopdec.topology.graph_io import (check_strongly_connected, effective_graph,  # noqa: F401
                                      from_graph, in_neighbors, load, out_neighbors, save, validate)
from hopdec.topology.spectral import (eigenvalue_moduli, normalized_laplacian_gap,  # noqa: F401
                                      spectral_gap)
from hopdec.topology.weights import (TOL, effective_weights, is_column_stochastic,  # noqa: F401
                                     is_doubly_stochastic, metropolis_weights, mixing_matrix,
                                     sparse_mixing_matrix, with_default_weights)
