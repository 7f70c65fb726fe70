"""An emulated network on one machine: hosts as network namespaces, links with bandwidth and delay.

:mod:`~hopdec.testbed.spec` says what the network is (hosts, NICs, links: plain data);
:mod:`~hopdec.testbed.netns` builds it with network namespaces, veth links, ``htb`` and a TUN delay
forwarder (:mod:`~hopdec.testbed.delay`), launches ``hopdec train`` across it through
``launch/hostfile.sh`` and tears it down; :mod:`~hopdec.testbed.probe` measures what the links give.
``python -m hopdec.testbed --help`` is the command line.
"""

from hopdec.testbed.spec import Host, Link, Testbed, by_machine, by_rank, from_json, sim_topology  # noqa: F401
