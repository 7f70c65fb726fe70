"""The summary a run ends with: the table every executor prints (:func:`summary_text`), and a real run's
way to it (:func:`gather_summary`: every rank's figures gathered on rank 0, the model evaluated). Live
progress is :mod:`hopdec.observe.progress`; the HTML report of logs is :mod:`hopdec.report`."""

import numpy as np


def gather_summary(ctx, logger, trainer, emulator, title, eval_flat="average", bound=None, extra=None,
                   workers=None, model_label="averaged model", bound_label="bound from the topology", notes=(),
                   mpi_buffers="host", unit="iters", finished=None):
    """Gather every rank's figures on rank 0, evaluate, print the summary table; returns it on rank 0.

    ``eval_flat``: "average" evaluates the average of all ranks' parameters (one Allreduce); an array
    evaluates those parameters (e.g. a parameter server's). ``workers``: the ranks that train (default:
    all); ``bound``: the iteration-gap bound to print beside the measured gap. Collective: every rank
    must call it; every collective is bounded by the peer timeout (:mod:`hopdec.transport.collectives`).
    ``finished`` (rank 0): the workers that ended training alive; one missing from what was gathered died
    after that (``--fault-tolerance``: at shutdown, or during this summary) and a note names it.
    For ranks whose model is on a GPU the summary says what they copied between host and device per
    iteration (:mod:`hopdec.ml.transfers`); ``mpi_buffers``: "host" (staged) or "device".
    """
    from hopdec.ml import transfers
    from hopdec.report.gaps import max_iteration_gap
    from hopdec.transport.collectives import allreduce_sum, gather_json

    comm = ctx.comm
    ctx.faults.at("evaluate")
    device = str(trainer.device) if trainer is not None else None
    copies = transfers.counts()                 # training's copies: the evaluation below is not counted
    loss, acc = trainer.evaluate() if trainer is not None else (None, None)
    mine = dict(rank=ctx.worker if ctx.worker is not None else ctx.rank, iterations=logger.iterations, wait_s=logger.wait_s,
                compute_s=logger.compute_s, loss=logger.last_loss, test_loss=loss, test_acc=acc,
                entries=logger.entries, jumps=logger.jumps,
                iter_per_s=logger.progress_rate,
                emulation=emulator.describe(overruns=False) if emulator is not None else "no emulation",
                overruns=emulator.overruns if emulator is not None else 0,
                max_overrun_s=emulator.max_overrun_s if emulator is not None else 0.0,
                device=device, copies=copies,
                **(extra or {}))
    if isinstance(eval_flat, str) and eval_flat == "average":
        buf = trainer.write_params(np.empty(trainer.numel, dtype=np.float32))
        total = allreduce_sum(comm, buf, ctx.timeout, "averaging the models for the summary")
        eval_flat = total / comm.Get_size()
    everyone = gather_json(comm, mine, ctx.timeout, "gathering the summary")
    if ctx.rank != 0:
        return None
    avg_loss, avg_acc = trainer.evaluate(eval_flat) if eval_flat is not None else (None, None)
    rows = [r for r in everyone if workers is None or r["rank"] in workers]
    late = sorted(set(finished or ()) - {r["rank"] for r in rows})
    if late:
        notes = [_died_late(late)] + list(notes)
    gap = int(max_iteration_gap([r["entries"] for r in rows]).max()) if rows else None
    emulations = sorted({r["emulation"] for r in rows})
    over = [r for r in rows if r["overruns"]]
    if over:
        emulations.append(f"measured compute exceeded the pad in {sum(r['overruns'] for r in over)} "
                          f"iterations on {len(over)} rank(s), up to {max(r['max_overrun_s'] for r in over):.3g} s "
                          f"(there the slowdowns multiplied the measured time)")
    times = ("measured; what was emulated went with the workers" if not rows
             else "measured, no emulation" if emulations == ["no emulation"]
             else "EMULATED -- " + "; ".join(emulations))
    from hopdec.launcher import network_conditions as conditions, network_label as label
    if conditions() is not None:            # links emulated by hopdec.testbed
        times += "; " + label(conditions())
    pcie = transfers.per_iteration_line([(r["rank"], r["device"], r["copies"], r["iterations"]) for r in rows],
                                        mpi_buffers)
    text = summary_text(title, rows, gap, times, avg_loss=avg_loss, avg_acc=avg_acc, bound=bound,
                        model_label=model_label, bound_label=bound_label, notes=list(notes) + [pcie] * bool(pcie),
                        unit=unit)
    print(text, flush=True)
    return dict(text=text, ranks=everyone, avg_loss=avg_loss, avg_acc=avg_acc, max_gap=gap)


def _died_late(ids):
    """The note for workers that ended training and died before their row reached the summary."""
    one = len(ids) == 1
    names = ", ".join(map(str, ids[:-1])) + (" and " if not one else "") + str(ids[-1])
    return (f"failure: {'worker' if one else 'workers'} {names} died after {'its' if one else 'their'} "
            f"training ended (at shutdown or during this summary): the table has no row for "
            f"{'it' if one else 'them'}")


def summary_text(title, rows, max_gap, times, avg_loss=None, avg_acc=None, bound=None,
                 model_label="averaged model", bound_label="bound from the topology", notes=(), unit="iters"):
    """The summary table of a run, as text (pure: a real run and the simulator both print it).

    ``rows``: one dict per worker with ``rank``, ``iterations``, ``iter_per_s``, ``wait_s``, ``compute_s``
    (totals), ``jumps``, ``loss``, ``test_acc``; ``max_gap``: the largest iteration gap observed (None:
    no row to observe it in);
    ``times``: what the times are (measured, emulated, simulated); ``notes``: lines printed last;
    ``unit``: what a row's iterations are, "iters" or "rounds" (``--local-steps``: the rate, wait and
    compute columns are then per round of local steps)."""
    from hopdec.runtime.metrics import format_table

    table = format_table(
        ["rank", f"{unit} run", "iter/s" if unit == "iters" else f"{unit}/s", "mean wait s", "mean compute s", "jumps",
         "train loss", "test acc"],
        [[r["rank"], r["iterations"], r["iter_per_s"],
          r["wait_s"] / max(r["iterations"], 1), r["compute_s"] / max(r["iterations"], 1),
          r["jumps"], r["loss"], r["test_acc"]] for r in rows])
    lines = [f"== {title} ==", table,
             f"{model_label}: test loss {avg_loss:.4f}, test accuracy {avg_acc:.4f}"
             if avg_acc is not None else "",
             (f"largest iteration gap observed: {int(max_gap)}" if max_gap is not None
              else "largest iteration gap observed: none (no worker row)")
             + (f" ({bound_label}: {bound:g})" if bound is not None else ""),
             "times: " + times] + list(notes)
    if any(r.get("send_stores") for r in rows):         # zero-copy sends: the pool's memory
        from hopdec.runtime.hop_loop import stores_line
        pooled = [r for r in rows if r.get("send_stores")]
        lines.append(stores_line([r["send_stores"] for r in pooled], pooled[0]["store_bytes"],
                                 max(r["store_cap"] for r in pooled)))
    return "\n".join(line for line in lines if line)
