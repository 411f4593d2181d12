"""The metric names a PromQL expression reads, and the sample names a Prometheus scrape holds.

PromQL is small enough that the names can be found without a full parser (none in pure Python is
maintained): strip what cannot hold a metric name — string literals, label matchers `{...}`, range
and subquery brackets `[...]`, `offset`/`@` modifiers, numbers, Grafana variables — then every
identifier left is a metric name unless it is a keyword, an aggregation's label list
(`by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left (...)`, `group_right (...)`)
or a function (an identifier followed by `(`).
"""

from __future__ import annotations

import re

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"}
    | {"inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_MODIFIERS = re.compile(r"\b(?:offset\s+-?[0-9a-zA-Z_$.]+|@\s*(?:start\(\)|end\(\)|[0-9.]+))")
_GRAFANA = re.compile(r"\$\{[^}]*\}|\$\w+")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (a Grafana `label_values(metric, label)` query included)."""
    query = _LABEL_VALUES.match(expr)
    if query is not None:
        return {query.group(1)}
    text = _STRING.sub(" ", expr)
    text = _GRAFANA.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _MODIFIERS.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+\S+")
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)")


def scraped(exposition: str) -> tuple[set[str], dict[str, str]]:
    """The sample names with at least one sample, and each family's TYPE, in a text exposition."""
    samples: set[str] = set()
    types: dict[str, str] = {}
    for line in exposition.splitlines():
        declared = _TYPE.match(line)
        if declared is not None:
            types[declared.group(1)] = declared.group(2)
            continue
        sample = _SAMPLE.match(line)
        if sample is not None and not line.startswith("#"):
            samples.add(sample.group(1))
    return samples, types


def family_of(name: str, types: dict[str, str]) -> tuple[str, str | None]:
    """The family a sample name belongs to and its TYPE: `x_bucket` of histogram `x`, `x_sum` and
    `x_count` of a histogram or summary `x`, else the name itself."""
    for suffix, kinds in (
        ("_bucket", {"histogram"}),
        ("_sum", {"histogram", "summary"}),
        ("_count", {"histogram", "summary"}),
    ):
        base = name.removesuffix(suffix)
        if base != name and types.get(base) in kinds:
            return base, types[base]
    return name, types.get(name)
