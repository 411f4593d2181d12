"""The Grafana dashboard and the Prometheus rules in deploy/observability/ against a real scrape.

A real `mcp-backfill serve` (the anthropic provider against the fake Claude API) serves real MCP
clients: one sampling call is retried once (a 529) and answered, the next is refused by the
client's token budget. Then `/metrics` is scraped, and every metric that a dashboard query or a rule
expression names must have samples there (with `_bucket`, `_sum` and `_count` only on histograms).
The files' shapes are checked too: promtool and Grafana are not available, so the structure they
expect is checked here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import yaml
from mcp import Client

from mcp_backfill.options import BUDGET_WINDOWS
from tests.fake_claude import FakeClaude, error_reply, text_reply
from tests.harness import ROOT, proxy_env, python_server, tool_json
from tests.promql_names import family_of, metric_names, scraped
from tests.sidecar_harness import HTTP_TIMEOUT, run_sidecar

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ASSETS = ROOT / "deploy" / "observability"
DASHBOARD = ASSETS / "grafana-dashboard.json"
RULES = ASSETS / "prometheus-rules.yaml"
SAMPLING_SERVER = python_server("sampling_server.py")
# Series Prometheus makes itself for every target: never in a scrape.
PROMETHEUS_SERIES = {"up"}


def plain(text: str) -> dict[str, Any]:
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": 20}
    return {"params_json": json.dumps(params)}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions() -> dict[str, str]:
    """Every PromQL expression of both files, by where it is (for the failure message)."""
    found: dict[str, str] = {}
    board = dashboard()
    for panel in panels(board):
        for target in panel.get("targets", []):
            found[f"dashboard panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found[f"dashboard variable {variable['name']}"] = variable["query"]["query"]
    for group in rules()["groups"]:
        for rule in group["rules"]:
            found[f"rule {rule.get('alert') or rule.get('record')}"] = rule["expr"]
    return found


async def test_every_metric_the_dashboard_and_rules_name_is_scraped(fake_claude: FakeClaude) -> None:
    fake_claude.enqueue(error_reply(529, "overloaded_error", "Overloaded"), text_reply("fine"))
    options = ("--client-budget-tokens", "10", "--budget-tokens", "1000000/day", "--retry-base-delay", "0.01")
    async with (
        run_sidecar(*options, upstream=SAMPLING_SERVER, env=proxy_env(fake_claude.url)) as sidecar,
        httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http,
        Client(sidecar.url, mode="legacy") as client,
    ):
        answered = tool_json(await client.call_tool("sample_raw", plain("one")))
        refused = tool_json(await client.call_tool("sample_raw", plain("two")))
        # The session is still open while /metrics is read: the sessions gauge counts it.
        exposition = (await http.get(f"{sidecar.base}/metrics")).text
    assert "result" in answered
    assert "--client-budget-tokens" in refused["error"]["message"]
    assert len(fake_claude.message_requests) == 2  # the 529, then the answer; nothing for the refusal

    samples, types = scraped(exposition)
    missing, misused = [], []
    for where, expr in expressions().items():
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        for name in sorted(names - PROMETHEUS_SERIES):
            if name not in samples:
                missing.append(f"{where}: {name}")
                continue
            family, kind = family_of(name, types)
            if kind is None or (name.endswith("_total") and kind != "counter"):
                misused.append(f"{where}: {name} ({family} is {kind})")
    assert missing == [], "named but not in /metrics after real traffic"
    assert misused == []
    # The traffic reached the series the alerts are about.
    assert 'outcome="retried",provider="anthropic",type="overloaded_error"' in exposition
    assert 'mcp_backfill_sampling_refusals_total{limit="client_budget_tokens"} 1' in exposition
    assert (
        'mcp_backfill_budget_limit_tokens{budget="client",client="anonymous",window="total"} 10' in exposition
    )
    # The budget limit gauge's help names the windows a budget has: total and BUDGET_WINDOWS, no others.
    windows = ", ".join(("total", *BUDGET_WINDOWS))
    help_line = next(
        line for line in exposition.splitlines() if "HELP mcp_backfill_budget_limit_tokens" in line
    )
    assert f"window: {windows})" in help_line, help_line
    # The guide's table (docs/sidecar.md sends readers there for the full list) has every metric.
    guide = (ASSETS / "README.md").read_text()
    families = {
        line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE mcp_backfill_")
    }
    assert sorted(name for name in families if f"`{name}`" not in guide) == []


def test_the_rules_file_has_the_shape_prometheus_loads() -> None:
    loaded = rules()
    assert set(loaded) == {"groups"}
    names = [group["name"] for group in loaded["groups"]]
    assert len(names) == len(set(names))
    alerts = []
    for group in loaded["groups"]:
        assert set(group) <= {"name", "interval", "limit", "rules"}
        assert group["rules"]
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str)
            assert rule["expr"].strip()
            allowed = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if "record" in rule:
                allowed = {"record", "expr", "labels"}
            assert set(rule) <= allowed, rule
            if "alert" in rule:
                alerts.append(rule["alert"])
                assert rule["alert"].isidentifier()
                assert isinstance(rule["for"], str)
                assert rule["for"][-1] in "smhdwy"
                assert rule["for"][:-1].isdigit()
                assert rule["labels"]["severity"] in {"critical", "warning", "info"}
                assert {"summary", "description"} <= set(rule["annotations"])
                assert all(isinstance(value, str) for value in rule["annotations"].values())
            assert expr_balanced(rule["expr"]), rule["expr"]
    assert len(alerts) == len(set(alerts))


def test_the_dashboard_has_the_shape_grafana_imports() -> None:
    board = dashboard()
    assert {"uid", "title", "panels", "templating", "schemaVersion"} <= set(board)
    assert isinstance(board["schemaVersion"], int)
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    for panel in panels(board):
        ids.append(panel["id"])
        assert panel["type"] in {"row", "timeseries", "stat", "bargauge", "table", "gauge"}
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("h", "w", "x", "y"))
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert expr_balanced(target["expr"]), target["expr"]
    assert len(ids) == len(set(ids))
    rows = [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in board["panels"]]
    assert len(rows) == len(set(rows))  # no two panels at the same place


def expr_balanced(expr: str) -> bool:
    """Brackets of all three kinds nest properly (outside string literals)."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote: str | None = None
    for char in expr:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            stack.append(char)
        elif char in closing and (not stack or stack.pop() != closing[char]):
            return False
    return not stack and quote is None


def test_the_guide_names_the_budget_windows_there_are() -> None:
    guide = (ASSETS / "README.md").read_text()
    windows = ", ".join(("total", *BUDGET_WINDOWS))
    assert f"`window`: {windows})" in guide


def test_the_assets_are_where_the_docs_say() -> None:
    guide = (ROOT / "deploy" / "observability" / "README.md").read_text()
    assert DASHBOARD.name in guide
    assert RULES.name in guide


def test_the_refusals_panel_names_limits_there_are() -> None:
    """The `limit` label is the name of the option whose limit refused (or `state_store`): the
    panel's examples are such names (`--max-tokens-cap` clamps, it refuses nothing)."""
    import re

    from mcp_backfill.options import BY_NAME

    refusing = set(BY_NAME) - {"max_tokens_cap"} | {"state_store"}
    panel = next(panel for panel in panels(dashboard()) if panel["title"] == "Refusals by limit")
    named = re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", panel["description"])
    assert named
    assert [name for name in named if name not in refusing] == []
