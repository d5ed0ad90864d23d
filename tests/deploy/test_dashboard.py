"""The Grafana dashboard in deploy/ uses exactly the names PAW exposes: every ``paw_*``
series it queries exists, and every PAW metric is on it."""

from __future__ import annotations

import json
import re

from prometheus_client import REGISTRY

from paw_project import metrics, metrics_http
from tests.processes import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "paw-dashboard.json"


def exposed() -> dict[str, set[str]]:
    """``{family name: its sample names}`` of every PAW metric a scrape can carry."""
    metrics.sandboxes_reader("node", lambda: {})  # as on a worker node
    try:
        families = [*REGISTRY.collect(), *metrics_http._Waiting().collect()]
    finally:
        metrics.sandboxes_reader(None)
    names: dict[str, set[str]] = {}
    for family in families:
        if family.name.startswith("paw_"):
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            names[family.name] = {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def queried() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {name for expr in expressions for name in re.findall(r"\bpaw_[a-z_]+", expr)}


def test_every_series_the_dashboard_queries_is_one_paw_exposes(db):
    samples = set().union(*exposed().values())
    assert queried() <= samples, queried() - samples


def test_every_paw_metric_is_on_the_dashboard(db):
    missing = [family for family, samples in exposed().items() if not samples & queried()]
    assert not missing, missing


def test_the_dashboard_queries_http_requests_by_view():
    text = DASHBOARD.read_text()
    assert "django_http_requests_total_by_view_transport_method_total" in text
    assert "django_http_requests_latency_seconds_by_view_method_bucket" in text
