#!/usr/bin/env python3
"""The Grafana and alerting check: docs/grafana/litebase-streams.json (the dashboard) and
docs/grafana/alerts.yml (the Prometheus rules) may only use metrics that exist, and must
be what Grafana and Prometheus load.

    python3 scripts/check-grafana.py [--require-promtool]      (make test runs it)

Dashboard: valid JSON; the data source is the template variable DS_PROMETHEUS, and the
variables database and instance exist; the rows are Overview, Streams, Subscriptions,
Webhooks, Gateway; every other panel has that data source, a description and at least
one target, every target an expr that names a litebase_streams_* metric; panel ids are
unique and panels do not overlap on the 24-column grid.
Rules: every rule is an alert with expr, labels.severity (critical or warning) and
annotations summary and description, and has a test in RULE_TESTS below.
Both: every litebase_streams_* name in an expr (or a variable's query) is one of METRICS
below, the names of issue 30's contract (a histogram also with _bucket, _sum, _count).
docs/operations.md, once it has the section "Prometheus, Grafana and alerting": its yaml
block quotes alerts.yml's rules exactly (without annotations), and its prose names each.
With promtool (Debian's prometheus package) also: `promtool check rules` on alerts.yml
(expressions and annotation templates); every dashboard expr parsed by promtool (as a
recording rule, Grafana's variables replaced); and `promtool test rules` on made-up
series: each alert fires on the condition it names and stays quiet on the near misses
(RULE_TESTS), and the dashboard's less obvious exprs give the values their panels map
(DASHBOARD_EXPR_TESTS). Without promtool those are skipped, visibly, or fail with
--require-promtool. Exit status 1 lists every failure.

A metric named here that the gateway's real /metrics lacks is caught by
tests/gateway_metrics.rs, which scrapes one.
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
except ImportError:  # python3-yaml: Debian's clang (llvm-*-tools) already brings it
    sys.exit("check-grafana: needs PyYAML (apt-get install python3-yaml)")

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "docs" / "grafana" / "litebase-streams.json"
ALERTS = REPO / "docs" / "grafana" / "alerts.yml"
OPERATIONS = REPO / "docs" / "operations.md"
OPERATIONS_SECTION = "## Prometheus, Grafana and alerting"

# The database side: streams.metrics() (the gateway's cached block, or an exporter).
DATABASE_METRICS = {
    "litebase_streams_horizon",
    "litebase_streams_newest_position",
    "litebase_streams_horizon_lag_positions",
    "litebase_streams_horizon_holder_age_seconds",
    "litebase_streams_delivery_lag_positions",
    "litebase_streams_worker_up",
    "litebase_streams_worker_state",
    "litebase_streams_worker_starts_total",
    "litebase_streams_worker_rounds_total",
    "litebase_streams_notifications_failing",
    "litebase_streams_notification_failures_total",
    "litebase_streams_events_total",
    "litebase_streams_subscription_pending",
    "litebase_streams_subscription_lag_seconds",
    "litebase_streams_subscription_claimed",
    "litebase_streams_subscription_retrying",
    "litebase_streams_subscription_parked",
    "litebase_streams_webhook_state",
    "litebase_streams_webhook_consecutive_failures",
    "litebase_streams_webhook_next_retry_seconds",
    "litebase_streams_webhook_pending",
}
# The gateway's own (gateway/src/metrics.rs, and the database poller's two).
GATEWAY_METRICS = {
    "litebase_streams_gateway_events_sent_total",
    "litebase_streams_gateway_slow_client_drops_total",
    "litebase_streams_gateway_listen_reconnects_total",
    "litebase_streams_gateway_unverified_notifications_total",
    "litebase_streams_gateway_notifications_total",
    "litebase_streams_gateway_topic_replays_total",
    "litebase_streams_gateway_connections",
    "litebase_streams_gateway_topics",
    "litebase_streams_gateway_listen_channels",
    "litebase_streams_gateway_forced_replays_total",
    "litebase_streams_gateway_privilege_checks_total",
    "litebase_streams_gateway_topic_limit_refusals_total",
    "litebase_streams_gateway_database_connections",
    "litebase_streams_gateway_database_metrics_up",
    "litebase_streams_gateway_database_metrics_age_seconds",
    "litebase_streams_gateway_topic_clients",
}
HISTOGRAMS = {"litebase_streams_gateway_query_duration_seconds"}
METRICS = DATABASE_METRICS | GATEWAY_METRICS | {f"{h}{s}" for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

NAME = re.compile(r"\blitebase_streams_[a-z0-9_]*[a-z0-9]")
GRAFANA_INTERVAL = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")
GRAFANA_VARIABLE = re.compile(r"\$\{\w+(:\w+)?\}|\$\w+")
SEVERITIES = {"critical", "warning"}

failures = []
passed = 0


def check(ok, what):
    global passed
    if ok:
        passed += 1
    else:
        failures.append(what)
    return ok


def unknown_names(text):
    return sorted({n for n in NAME.findall(text) if n not in METRICS})


def grid_cells(panel):
    g = panel["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


def check_dashboard():
    """The dashboard's structure and names; returns its exprs for promtool."""
    try:
        board = json.loads(DASHBOARD.read_text())
    except (OSError, ValueError) as error:
        check(False, f"{DASHBOARD.relative_to(REPO)}: {error}")
        return []
    where = DASHBOARD.relative_to(REPO)
    check(board.get("schemaVersion", 0) >= 36, f"{where}: schemaVersion {board.get('schemaVersion')} (want >= 36)")
    check(bool(board.get("uid")) and bool(board.get("title")), f"{where}: needs uid and title")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    source = variables.get("DS_PROMETHEUS", {})
    check(source.get("type") == "datasource" and source.get("query") == "prometheus",
          f"{where}: template variable DS_PROMETHEUS (type datasource, query prometheus) missing")
    for name in ("database", "instance"):
        variable = variables.get(name)
        if not check(variable is not None, f"{where}: template variable {name} missing"):
            continue
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        check(bool(NAME.search(query)), f"{where}: variable {name}: query names no litebase_streams_ metric")
        check(not unknown_names(query), f"{where}: variable {name}: unknown metrics {unknown_names(query)}")

    exprs = []
    ids = set()
    taken = {}
    panels = board.get("panels", [])
    check(bool(panels), f"{where}: no panels")
    rows = [p.get("title") for p in panels if p.get("type") == "row"]
    check(rows == ["Overview", "Streams", "Subscriptions", "Webhooks", "Gateway"],
          f"{where}: rows are {rows}")
    for panel in panels:
        label = f"{where}: panel {panel.get('id')} {panel.get('title')!r}"
        check(panel.get("id") not in ids, f"{label}: duplicate id")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if check({"x", "y", "w", "h"} <= grid.keys() and grid["x"] + grid["w"] <= 24, f"{label}: gridPos {grid}"):
            cells = grid_cells(panel)
            overlapped = sorted({taken[cell] for cell in cells if cell in taken})
            check(not overlapped, f"{label}: overlaps panels {overlapped}")
            taken.update((cell, panel.get("id")) for cell in cells)
        if panel.get("type") == "row":
            check(not panel.get("panels"), f"{label}: a collapsed row hides its panels from this check")
            continue
        check(panel.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}", f"{label}: datasource is not ${{DS_PROMETHEUS}}")
        check(bool(panel.get("description")), f"{label}: no description")
        targets = panel.get("targets") or []
        check(bool(targets), f"{label}: no targets")
        for target in targets:
            expr = target.get("expr", "")
            check(target.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}",
                  f"{label}, target {target.get('refId')}: datasource is not ${{DS_PROMETHEUS}}")
            if not check(bool(NAME.search(expr)), f"{label}, target {target.get('refId')}: no litebase_streams_ metric in {expr!r}"):
                continue
            check(not unknown_names(expr), f"{label}: unknown metrics {unknown_names(expr)}")
            exprs.append((label, expr, target.get("refId")))
    return exprs


def load_rules():
    try:
        rules = yaml.safe_load(ALERTS.read_text())
    except (OSError, yaml.YAMLError) as error:
        check(False, f"{ALERTS.relative_to(REPO)}: {error}")
        return None
    where = ALERTS.relative_to(REPO)
    names = set()
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            label = f"{where}: {rule.get('alert') or rule.get('record')}"
            check("alert" in rule, f"{label}: not an alert")
            check(rule.get("alert") not in names, f"{label}: duplicate alert name")
            names.add(rule.get("alert"))
            expr = str(rule.get("expr", ""))
            check(bool(NAME.search(expr)), f"{label}: no litebase_streams_ metric in expr")
            check(not unknown_names(expr), f"{label}: unknown metrics {unknown_names(expr)}")
            check(rule.get("labels", {}).get("severity") in SEVERITIES, f"{label}: labels.severity not in {SEVERITIES}")
            annotations = rule.get("annotations", {})
            check(bool(annotations.get("summary")) and bool(annotations.get("description")),
                  f"{label}: needs annotations summary and description")
    check(names >= set(RULE_TESTS), f"{where}: alerts without a test or tests without an alert: "
          f"{sorted(set(RULE_TESTS) ^ names)}")
    check(names <= set(RULE_TESTS), f"{where}: alerts without a rule test: {sorted(names - set(RULE_TESTS))}")
    return rules


# promtool test rules, per alert: (input series, [(eval time, [expected labels, ...])]).
# Labels are those beyond alertname and severity; [] means it must not fire then. The
# series use one scrape a minute; two gateways report the same database where one
# alert per database (not per gateway) is what the rule promises.
def series(metric, values, **labels):
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{labels}}}", "values": values}


RULE_TESTS = {
    "LitebaseStreamsHorizonHeld": (
        [series("litebase_streams_horizon_holder_age_seconds", "0 60 120 180 240 300 360 420 480 0 0", database="app", instance="gw1"),
         series("litebase_streams_horizon_holder_age_seconds", "0 60 120 180 240 300 360 420 480 0 0", database="app", instance="gw2"),
         series("litebase_streams_horizon_holder_age_seconds", "0 1 0 2 0 1 0 1 0 1 0", database="quiet", instance="gw1")],
        [("5m", []), ("6m", []), ("7m", [{"database": "app"}]), ("10m", [])]),
    "LitebaseStreamsHorizonStuck": (
        [series("litebase_streams_horizon", "100+10x20", database="busy", instance="gw1"),
         series("litebase_streams_horizon_lag_positions", "5x20", database="busy", instance="gw1"),
         series("litebase_streams_horizon", "100x20", database="stuck", instance="gw1"),
         series("litebase_streams_horizon_lag_positions", "5x20", database="stuck", instance="gw1"),
         series("litebase_streams_horizon", "100x20", database="idle", instance="gw1"),
         series("litebase_streams_horizon_lag_positions", "0x20", database="idle", instance="gw1"),
         # an idle log, one publish caught in flight by one sample: not stuck
         series("litebase_streams_horizon", "100x20", database="blip", instance="gw1"),
         series("litebase_streams_horizon_lag_positions", "0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0", database="blip", instance="gw1"),
         # moved at 3m, then stuck: fires once 5 minutes have passed since (and not
         # at 1m, when its series was too young to say)
         series("litebase_streams_horizon", "100 100 100 200 200 200 200 200 200 200 200 200", database="late", instance="gw1"),
         series("litebase_streams_horizon_lag_positions", "5x11", database="late", instance="gw1")],
        [("2m", []), ("5m", []), ("6m", [{"database": "stuck"}]), ("8m", [{"database": "stuck"}]),
         ("9m", [{"database": "late"}, {"database": "stuck"}])]),
    "LitebaseStreamsWorkerDown": (
        [series("litebase_streams_worker_up", "1 1 1 0 0 0 0 1 1", database="app", instance="gw1"),
         series("litebase_streams_worker_up", "1 1 1 0 0 0 0 1 1", database="app", instance="gw2"),
         series("litebase_streams_worker_up", "1 0 1 1 1 1 1 1 1", database="blip", instance="gw1"),
         # a hot standby has no worker; its primary's worker runs, then stops at 3m
         series("litebase_streams_worker_up", "0x8", database="replicated", instance="standby"),
         series("litebase_streams_worker_state", "1x8", database="replicated", instance="standby", state="standby"),
         series("litebase_streams_worker_up", "1 1 1 0 0 0 0 0 0", database="replicated", instance="primary"),
         series("litebase_streams_worker_state", "1 1 1 stale", database="replicated", instance="primary", state="idle"),
         series("litebase_streams_worker_state", "_ _ _ 1 1 1 1 1 1", database="replicated", instance="primary", state="not running"),
         series("litebase_streams_worker_up", "0x8", database="standby_only", instance="standby"),
         series("litebase_streams_worker_state", "1x8", database="standby_only", instance="standby", state="standby")],
        [("2m", []), ("3m", []), ("4m", [{"database": "app"}, {"database": "replicated"}]),
         ("6m", [{"database": "app"}, {"database": "replicated"}]), ("8m", [{"database": "replicated"}])]),
    "LitebaseStreamsWorkerRetrying": (
        [series("litebase_streams_worker_state", "_ 1 1 1 1 1 1 1 1", database="app", instance="gw1", state="retrying"),
         series("litebase_streams_worker_state", "1 stale 1 stale 1 stale 1 stale 1", database="flapping", instance="gw1", state="retrying")],
        [("5m", []), ("6m", [{"database": "app"}])]),
    "LitebaseStreamsMetricsAbsent": (
        [series("litebase_streams_gateway_topics", "0x10", instance="gw1")],
        [("4m", []), ("5m", [{}])]),
    "LitebaseStreamsNotificationsFailing": (
        [series("litebase_streams_notifications_failing", "0 0 1 1 1 1 1 1 1 1 1 1 1", database="full", instance="gw1", reason="queue_full"),
         series("litebase_streams_notifications_failing", "0x12", database="fine", instance="gw1", reason="ok"),
         series("litebase_streams_notification_failures_total", "0x12", database="fine", instance="gw1"),
         series("litebase_streams_notification_failures_total", "0 1 2 3 4 5 6 7 8 9 10 11 12", database="flaky", instance="gw1"),
         series("litebase_streams_notifications_failing", "0x12", database="flaky", instance="gw1", reason="ok")],
        [("5m", []), ("6m", [{"database": "flaky"}]), ("8m", [{"database": "flaky"}, {"database": "full"}])]),
    "LitebaseStreamsSubscriptionLag": (
        [series("litebase_streams_subscription_lag_seconds", "0+60x20", database="app", instance="gw1", owner="billing", subscription="invoices"),
         series("litebase_streams_subscription_lag_seconds", "0+60x20", database="app", instance="gw2", owner="billing", subscription="invoices"),
         series("litebase_streams_subscription_lag_seconds", "250x20", database="app", instance="gw1", owner="billing", subscription="slow")],
        [("15m", []), ("16m", [{"database": "app", "owner": "billing", "subscription": "invoices"}])]),
    "LitebaseStreamsDeadLetters": (
        [series("litebase_streams_subscription_parked", "0 0 0 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2", database="app", instance="gw1", owner="billing", subscription="invoices"),
         # dead letters retried: fewer is no alert
         series("litebase_streams_subscription_parked", "3 3 3 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", database="app", instance="gw1", owner="billing", subscription="retried")],
        [("2m", []), ("4m", [{"database": "app", "owner": "billing", "subscription": "invoices"}]), ("15m", [])]),
    "LitebaseStreamsWebhookDisabled": (
        [series("litebase_streams_webhook_state", "1 1 0 0 0 0", database="app", instance="gw1", owner="app", webhook="crm", state="active"),
         series("litebase_streams_webhook_state", "0 0 1 1 1 1", database="app", instance="gw1", owner="app", webhook="crm", state="disabled"),
         series("litebase_streams_webhook_state", "0x5", database="app", instance="gw1", owner="app", webhook="ok", state="disabled"),
         series("litebase_streams_webhook_state", "1x5", database="app", instance="gw1", owner="app", webhook="ok", state="paused"),
         # beyond max_subscriptions: two of the unlabelled webhooks disabled
         series("litebase_streams_webhook_state", "2x5", database="app", instance="gw1", owner="(other)", webhook="(other)", state="disabled"),
         series("litebase_streams_webhook_state", "7x5", database="app", instance="gw1", owner="(other)", webhook="(other)", state="active")],
        [("0m", []), ("2m", [{"database": "app", "owner": "(other)", "webhook": "(other)"}]),
         ("3m", [{"database": "app", "owner": "(other)", "webhook": "(other)"}, {"database": "app", "owner": "app", "webhook": "crm"}])]),
    "LitebaseStreamsGatewayDatabaseMetricsDown": (
        [series("litebase_streams_gateway_database_metrics_up", "1 1 0 0 0 0 0 0 0 1", database="app", instance="gw1"),
         series("litebase_streams_gateway_database_metrics_age_seconds", "1 1 1 1 1 1 1 1 1 1", database="app", instance="gw1"),
         series("litebase_streams_gateway_database_metrics_up", "1x9", database="app", instance="gw2"),
         series("litebase_streams_gateway_database_metrics_age_seconds", "1 1 61 121 181 241 301 361 421 481", database="app", instance="gw2")],
        [("6m", []), ("7m", [{"database": "app", "instance": "gw1"}, {"database": "app", "instance": "gw2"}]), ("9m", [{"database": "app", "instance": "gw2"}])]),
}


def check_operations_quote():
    """docs/operations.md quotes the rules (without annotations) and says what to do
    for each: the quote must be alerts.yml's rules, and each alert must be named
    outside the quote too."""
    where = OPERATIONS.relative_to(REPO)
    text = OPERATIONS.read_text()
    start = text.find(OPERATIONS_SECTION)
    if start < 0:
        print(f"check-grafana: {where} has no section {OPERATIONS_SECTION!r}: its quote of the rules is not checked")
        return
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    blocks = re.findall(r"^```yaml\n(.*?)^```", section, re.S | re.M)
    quoted = [yaml.safe_load(b) for b in blocks if b.lstrip().startswith("groups:")]
    if not check(len(quoted) == 1, f"{where}: want one yaml block with the rules (groups:), found {len(quoted)}"):
        return

    def shape(rules):
        return [(r.get("alert"), " ".join(str(r.get("expr", "")).split()), r.get("for"), r.get("labels"))
                for g in rules.get("groups", []) for r in g.get("rules", [])]
    check(shape(quoted[0]) == shape(RULES), f"{where}: its quote of the rules differs from {ALERTS.relative_to(REPO)}")
    prose = re.sub(r"^```.*?^```", "", section, flags=re.S | re.M)
    missing = [alert for alert, *_ in shape(RULES) if alert not in prose]
    check(not missing, f"{where}: says nothing about {missing}")


# The dashboard's less obvious exprs, evaluated by promtool on made-up series:
# (panel title, refId, input series, [(labels, value) expected at 1m]).
DASHBOARD_EXPR_TESTS = [
    # The state set becomes one code per webhook for the state timeline's value mappings.
    ("Webhook state", "A",
     [series("litebase_streams_webhook_state", "1x2", database="app", instance="gw1", owner="app", webhook=name, state=state)
      for name, current in (("crm", "disabled"), ("mail", "active"), ("sms", "paused"), ("push", "retrying"))
      for state in ("active", "retrying", "paused", "disabled") if state == current] +
     [series("litebase_streams_webhook_state", "0x2", database="app", instance="gw1", owner="app", webhook=name, state=state)
      for name, current in (("crm", "disabled"), ("mail", "active"), ("sms", "paused"), ("push", "retrying"))
      for state in ("active", "retrying", "paused", "disabled") if state != current] +
     # beyond max_subscriptions the state set counts webhooks: the worst state present shows
     [series("litebase_streams_webhook_state", v, database="app", instance="gw1", owner="(other)", webhook="(other)", state=state)
      for state, v in (("active", "5x2"), ("retrying", "2x2"), ("paused", "0x2"), ("disabled", "0x2"))],
     [({"database": "app", "owner": "app", "webhook": "crm"}, 3), ({"database": "app", "owner": "app", "webhook": "mail"}, 0),
      ({"database": "app", "owner": "app", "webhook": "push"}, 1), ({"database": "app", "owner": "app", "webhook": "sms"}, 2),
      ({"database": "app", "owner": "(other)", "webhook": "(other)"}, 1)]),
    # A hot standby's missing worker is left out; its primary's counts.
    ("Worker", "A",
     [series("litebase_streams_worker_up", "0x2", database="app", instance="standby"),
      series("litebase_streams_worker_state", "1x2", database="app", instance="standby", state="standby"),
      series("litebase_streams_worker_up", "1x2", database="app", instance="primary"),
      series("litebase_streams_worker_state", "1x2", database="app", instance="primary", state="idle"),
      series("litebase_streams_worker_up", "0x2", database="replica_only", instance="standby"),
      series("litebase_streams_worker_state", "1x2", database="replica_only", instance="standby", state="standby")],
     [({"database": "app"}, 1)]),
]


def dashboard_expr_tests(board_exprs):
    tests = []
    for title, ref, inputs, expected in DASHBOARD_EXPR_TESTS:
        exprs = [e for (label, e, r) in board_exprs if label.endswith(f"{title!r}") and r == ref]
        if not check(len(exprs) == 1, f"DASHBOARD_EXPR_TESTS: no single panel {title!r} target {ref}"):
            continue
        samples = [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}
                   for labels, value in expected]
        tests.append({"interval": "1m", "input_series": inputs,
                      "promql_expr_test": [{"expr": grafana_to_promql(exprs[0]), "eval_time": "1m", "exp_samples": samples}]})
    return tests


def rule_tests_file(rules_file, board_exprs=()):
    """The RULE_TESTS (and DASHBOARD_EXPR_TESTS) as one promtool test file (JSON is YAML)."""
    tests = dashboard_expr_tests(board_exprs)
    for alert, (inputs, expectations) in RULE_TESTS.items():
        tests.append({
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [
                {"eval_time": at, "alertname": alert,
                 "exp_alerts": [{"exp_labels": dict(labels, severity=severity_of(alert))} for labels in expected]}
                for at, expected in expectations],
        })
    return {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests}


def severity_of(alert):
    for group in RULES.get("groups", []):
        for rule in group.get("rules", []):
            if rule.get("alert") == alert:
                return rule.get("labels", {}).get("severity")
    return None


def promtool(*args):
    result = subprocess.run(["promtool", *args], capture_output=True, text=True)
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def run_promtool(exprs, work):
    ok, output = promtool("check", "rules", str(ALERTS))
    check(ok, f"promtool check rules {ALERTS.relative_to(REPO)}:\n{output}")

    # The dashboard's exprs as recording rules: promtool parses each one.
    recording = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": grafana_to_promql(expr)} for i, (_, expr, _) in enumerate(exprs)]}]}
    path = work / "dashboard-exprs.yml"
    path.write_text(json.dumps(recording))
    ok, output = promtool("check", "rules", str(path))
    if not ok:
        # say which panel's expr it was
        for i, (label, expr, _) in enumerate(exprs):
            if f"dashboard:expr_{i}" in output or f"{i}:" in output:
                output += f"\n  ({label}: {expr})"
    check(ok, f"promtool: the dashboard's exprs do not parse:\n{output}")

    # The rule tests run on a copy without annotations: promtool compares those too,
    # and check rules above has parsed their templates already.
    plain = json.loads(json.dumps(RULES))
    for group in plain["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules_file = work / "alerts-plain.yml"
    rules_file.write_text(json.dumps(plain))
    tests_file = work / "alerts-test.yml"
    tests_file.write_text(json.dumps(rule_tests_file(rules_file, exprs)))
    ok, output = promtool("test", "rules", str(tests_file))
    check(ok, f"promtool test rules (RULE_TESTS and DASHBOARD_EXPR_TESTS of {Path(__file__).name}):\n{output}")


def grafana_to_promql(expr):
    expr = GRAFANA_INTERVAL.sub("1m", expr)
    return GRAFANA_VARIABLE.sub(".*", expr)


REQUIRE_PROMTOOL = "--require-promtool" in sys.argv[1:]
exprs = check_dashboard()
RULES = load_rules() or {}
check_operations_quote()
if shutil.which("promtool"):
    with tempfile.TemporaryDirectory(prefix="check-grafana-") as tmp:
        run_promtool(exprs, Path(tmp))
elif REQUIRE_PROMTOOL:
    check(False, "promtool not found (apt-get install prometheus; scripts/setup.sh should have)")
else:
    print("check-grafana: SKIP promtool checks (promtool not found: apt-get install prometheus)")

for failure in failures:
    print(f"FAIL: {failure}")
print(f"check-grafana: {len(exprs)} dashboard exprs, {sum(len(g.get('rules', [])) for g in RULES.get('groups', []))} alert rules")
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
