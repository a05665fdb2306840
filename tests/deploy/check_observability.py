#!/usr/bin/python3
"""Checks deploy/grafana/*.json and deploy/prometheus/alerts.yml against a live hyscaled: every
hyscale_* series their PromQL names is one hyscaled exports (from a real scrape of /metrics),
every expression parses (as recording rules through `promtool check rules`), and the dashboard
has the panels the deployment promises.

Usage: check_observability.py BUILD_DIR
"""
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from checks import check, finish

ROOT = Path(__file__).resolve().parents[2]
# Grafana's variables, replaced by something PromQL parses.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$job_id": ".*"}


def scrape(hyscaled):
    """The metric names in a scrape of a fresh hyscaled (families with no series included)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen([hyscaled, "--listen=127.0.0.1:0", f"--data-dir={data}",
                                 f"--metrics-listen=127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 20
            text = None
            while text is None and time.time() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        text = r.read().decode()
                except OSError:
                    time.sleep(0.1)
            if text is None:
                sys.exit(f"FAIL: no /metrics from hyscaled on port {port}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    names = {"up"}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def dashboard_exprs(path):
    dashboard = json.loads(path.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    check(len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids")
    exprs = []
    for panel in dashboard["panels"]:
        check(panel.get("targets"), f"{path.name}: panel '{panel['title']}' has no query")
        exprs += [(f"{path.name}: {panel['title']}", t["expr"]) for t in panel.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append((f"{path.name}: variable {var['name']}",
                          re.sub(r"label_values\((\w+), \w+\)", r"\1", var["query"]["query"])))
    return exprs


def main():
    build = Path(sys.argv[1])
    exported = scrape(str(build / "server" / "hyscaled"))
    dashboards = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
    exprs = []
    for path in dashboards:
        exprs += dashboard_exprs(path)
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs += [(f"alerts.yml: {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]

    for where, expr in exprs:
        for name in set(re.findall(r"\b(hyscale_[a-z0-9_]+|up)\b", expr)):
            check(name in exported, f"{where}: hyscaled exports no {name}")

    # The dashboard covers what it is for: one query each.
    dashboard_text = "\n".join(e for w, e in exprs if not w.startswith("alerts.yml"))
    for needed in ["hyscale_jobs", "hyscale_job_step_phase_seconds_sum", "tokens_per_second",
                   'phase=~"selection_.*"', 'phase=~"comm_.*"', "hyscale_job_indexer_recall",
                   "hyscale_job_key_sharing",
                   "hyscale_job_predicted_memory_bytes", "hyscale_job_predicted_step_seconds",
                   "hyscale_job_step_seconds"]:
        check(needed in dashboard_text, f"dashboards: no panel queries {needed}")

    # Syntax: each expression as a recording rule.
    def substitute(expr):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        return expr
    recording = {"groups": [{"name": "exprs", "rules": [
        {"record": f"check:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump(recording, f)
        f.flush()
        result = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                                text=True, timeout=60)
        check(result.returncode == 0,
              "promtool check rules on the expressions: " + result.stdout + result.stderr)

    return finish(f"observability: {len(exprs)} expressions in {len(dashboards)} dashboard(s) "
                  f"and the alert rules parse and name only exported series "
                  f"({len(exported)} names)")


if __name__ == "__main__":
    sys.exit(main())
