"""The PromQL name finder the dashboard test relies on: it must find every metric and nothing else."""

from __future__ import annotations

import pytest

from tests.promql_names import family_of, metric_names, scraped


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        (
            'sum by (client) (rate(a_total{client=~"$client", x="by (y)"}[$__rate_interval])) * 60',
            {"a_total"},
        ),
        ("histogram_quantile(0.95, sum by (le) (rate(h_bucket[10m])))", {"h_bucket"}),
        ("sum(rate(s_sum[5m])) / sum(rate(s_count[5m]))", {"s_sum", "s_count"}),
        ("a / on (job) group_left (instance) b", {"a", "b"}),
        ("rate(x_total[1h] offset 1d) > 3 * rate(x_total[1h])", {"x_total"}),
        ("max without (window) (used / limit) > 0.9", {"used", "limit"}),
        ("absent(m) or vector(0) unless n", {"m", "n"}),
        ("1e3 * rate(k:recorded:rate5m[5m] @ end())", {"k:recorded:rate5m"}),
        ("label_values(mcp_thing_total, client)", {"mcp_thing_total"}),
        ("sum(x) > bool 5", {"x"}),
        ("rate(q_total[5m:30s])", {"q_total"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_scraped_names_and_families() -> None:
    text = (
        "# HELP h latency\n# TYPE h histogram\n"
        'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\nh_sum 0.5\nh_count 1\n'
        "# TYPE c_total counter\n"  # declared, no samples
        '# TYPE g gauge\ng{a="b c"} 3\n'
    )
    samples, types = scraped(text)
    assert samples == {"h_bucket", "h_sum", "h_count", "g"}
    assert family_of("h_bucket", types) == ("h", "histogram")
    assert family_of("h_count", types) == ("h", "histogram")
    assert family_of("g", types) == ("g", "gauge")
    assert family_of("c_total", types) == ("c_total", "counter")
    assert family_of("g_bucket", types) == ("g_bucket", None)
