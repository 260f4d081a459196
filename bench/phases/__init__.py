"""The phases of bench/bench.py, one module each, found by discovery: adding a
phase is adding a file here (and its targets to bench/targets.toml).

A phase module defines:

  NAME        the phase's name (--only NAME); defaults to the module's name
  ORDER       its place in the run and in the report (sections, targets, notes)
  FULL, QUICK its settings for a full and a smoke run (merged into one config,
              saved in results.json's "config")
  run(b)      measures, into b.res (b: common.Bench); optional (a report-only
              module such as storage or delivery has none)

and optionally:

  OWN_DB = True     run() recreates the database itself
  OPTIONAL = True   runs only with --large or --quick, after the others
  finish(res, out_dir, quick)   after a whole run, before results.json is written
  values(res)       {target id: {"value": ..., name fields...}} for bench/targets.toml
  notes(res, short) shortfall notes (short: ids of the targets that fell short)
  section(res, w)   its part of docs/benchmarks.md (w appends one line)
  plots(res, out_dir) its plots

Every report function reads results.json only (res), so --report-only works.
"""

import importlib
import pkgutil


def all_phases():
    """Every phase module, in ORDER."""
    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
            if not m.name.startswith("_")]
    for m in mods:
        if not hasattr(m, "NAME"):
            m.NAME = m.__name__.rsplit(".", 1)[1]
    return sorted(mods, key=lambda m: m.ORDER)
