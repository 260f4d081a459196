"""4. Storage: bytes per event, streams tables vs bench_plain with the same
rows. Report only: publish.py measures the one-event-per-transaction data set
(res["storage_single"]) and replay.py the replay data set (res["storage_batch"])."""

from common import f0, fx

ORDER = 40


def values(res):
    return {
        "storage_single": dict(value=res["storage_single"]["ratio"]),
        "storage_batch": dict(value=res["storage_batch"]["ratio"],
                              chunk=f"{res['config']['replay_chunk']:,}"),
    }


def notes(res, short):
    if not short & {"storage_single", "storage_batch"}:
        return []
    cfg = res["config"]
    out = []
    for key, what in [("storage_single", "one event per transaction"),
                      ("storage_batch", f"{cfg['replay_chunk']:,} events per transaction")]:
        if key not in short:
            continue
        st = res[key]
        e = st["events"]
        out.append(
            f"**storage, {what}:** {st['ours_per_event']:.0f} B per event against "
            f"{st['plain_per_row']:.0f} B; `streams.commit_times` (the commit times by position, "
            f"{f0(st['commit_time_rows'])} rows) accounts for {st['commit_times_total'] / e:.0f} B "
            f"of it, `event_log` for {st['event_log_total'] / e:.0f} B (heap "
            f"{st['event_log_heap'] / e:.0f} B, {st['event_log_index_count']} indexes "
            f"{st['event_log_indexes'] / e:.0f} B; bench_plain: heap "
            f"{st['plain_heap'] / st['plain_rows']:.0f} B, {st['plain_index_count']} indexes "
            f"{st['plain_indexes'] / st['plain_rows']:.0f} B).")
    return out


def section(res, w):
    cfg = res["config"]
    ss, sb = res["storage_single"], res["storage_batch"]
    w("## 4. Storage")
    w("")
    w("Bytes per event: `pg_total_relation_size` (heap, TOAST, indexes, free-space and "
      "visibility maps) of `streams.event_log` + `streams.commit_times` + "
      "`streams.horizon_state`, divided by the number of events, against `bench_plain`'s total "
      "size divided by its rows, after `VACUUM (ANALYZE)`.")
    w("")
    w("| data set | events | streams tables | of which event_log heap / indexes / commit_times | bench_plain | of which heap / indexes | ratio |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for label, st in [("one event per transaction (the pgbench runs of section 1; bench_plain: "
                       "the plain INSERT and INSERT + pg_notify runs)", ss),
                      (f"replay data set ({cfg['replay_chunk']:,} events per transaction; "
                       "bench_plain: a copy of the same rows)", sb)]:
        e = st["events"]
        w(f"| {label} | {f0(e)} | {st['ours_per_event']:.1f} B | "
          f"{st['event_log_heap'] / e:.1f} / {st['event_log_indexes'] / e:.1f} / "
          f"{st['commit_times_total'] / e:.1f} B | {st['plain_per_row']:.1f} B "
          f"({f0(st['plain_rows'])} rows) | "
          f"{st['plain_heap'] / st['plain_rows']:.1f} / {st['plain_indexes'] / st['plain_rows']:.1f} B | "
          f"{fx(st['ratio'])} |")
    w("")
    w(f"`event_log` has {sb['event_log_index_count']} indexes, `bench_plain` "
      f"{sb['plain_index_count']} (primary key, `(stream, id)`); `streams.commit_times` holds the "
      "commit times by position, in rows of up to 4,096 positions (one per worker round, merged "
      "every few seconds).")
    w("")

