"""Drivers that carry out the protocol cores' actions on real processes: the worker loop, the torch
backend, run context, emulated heterogeneity, logs and the end-of-run report."""
