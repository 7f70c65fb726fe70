"""The emulated network a run had, for its log header and summary (pure; no kernel access).

A testbed passes its conditions to every rank in the environment variable :data:`ENV` (JSON, see
:meth:`hopdec.testbed.spec.Testbed.conditions`); ``hopdec train`` writes them into every log header
(key ``network``) and names them on the summary's ``times:`` line, so a figure is never read without
the links it was measured on.
"""

import json
import os

ENV = "HOPDEC_NETWORK"
MAX_CHARS = 1 << 16


def conditions(environ=None):
    """The conditions in the environment: a dict, ``None`` when not set; a value that is not a JSON
    object (or is too long) is kept as ``{"unparsed": first 200 characters}`` -- a label, never code."""
    text = (os.environ if environ is None else environ).get(ENV)
    if not text:
        return None
    try:
        value = json.loads(text) if len(text) <= MAX_CHARS else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"unparsed": text[:200]}


def label(cond):
    """One line for the summary: ``network EMULATED (...)`` with hosts and the distinct link settings."""
    if not cond:
        return ""
    if "hosts" not in cond:
        return "network EMULATED (conditions not readable)"
    hosts = cond.get("hosts") or []
    nics = sorted({h.get("nic_mbit") for h in hosts}, key=lambda x: (x is None, x or 0))
    links = sorted({(lk.get("mbit"), lk.get("delay_ms")) for lk in cond.get("links") or []},
                   key=lambda x: (x[0] is None, x[0] or 0, x[1] or 0))

    def bw(x):
        return "unshaped" if x is None else f"{x:g} Mbit/s"
    parts = [f"{len(hosts)} hosts in network namespaces" + (f" ({cond['testbed']})" if cond.get("testbed") else ""),
             "NICs " + ", ".join(bw(x) for x in nics)]
    if links:
        parts.append("links " + ", ".join(bw(m) + (f" +{d:g} ms" if d else "") for m, d in links))
    return "network EMULATED: " + "; ".join(parts)
