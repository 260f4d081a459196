"""Live delivery, exactly once: every notification the LISTEN client should
have received in sections 1, 1b and 2, received once. Report only: it sums
delivery(res) of every phase that defines it (publish, tpcb, latency, lag)."""

ORDER = 55


def _phases():
    from phases import all_phases
    return [m for m in all_phases() if hasattr(m, "delivery")]


def values(res):
    lost = extra = 0
    complete = True
    for m in _phases():
        lo, ex, ok = m.delivery(res)
        lost, extra, complete = lost + lo, extra + ex, complete and ok
    return {"exactly_once": dict(value=complete,
                                 shown=None if complete else f"no: {lost:,} missing, {extra:,} duplicated")}


def notes(res, short):
    if "exactly_once" not in short:
        return []
    return ["**live delivery lost or duplicated notifications:** see sections 1, 1b and 2; "
            "latency figures cover the events that arrived."]
