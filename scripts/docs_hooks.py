"""MkDocs hooks (mkdocs.yml): the reference tables of the documentation site, generated from
the code at build time so that they cannot drift from it.

A page asks for one with a marker line:

- ``<!-- generated: configuration -->``: every configuration key (doq_lib.config's schema)
  with its type, default, environment variables and description;
- ``<!-- generated: rest -->``: every REST route (the registered routes, as /openapi.json
  describes them) with its summary and the key roles it needs;
- ``<!-- generated: grpc -->``: every method of the gRPC service (proto/doq.proto), with the
  comment above it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
# MkDocs puts sys.path back after loading a hook: what it needs is imported now.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from doq_lib.config import IGNORED, KEY_DOCS, KEYS, Config  # noqa: E402
from doq_lib.http import FAILURES, ROUTES, openapi  # noqa: E402
from doq_lib.http.schema import SCHEMAS  # noqa: E402


def _cell(text: object) -> str:
    """Text that stays inside one cell of a Markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`" if value else "(none)"
    if value == "":
        return "(none)"
    return f"`{value}`"


_TYPES = {bool: "bool", int: "integer", float: "number", str: "text", tuple: "list"}


def configuration_table() -> str:
    defaults = Config()
    rows = ["| key | type | default | environment | meaning |", "|---|---|---|---|---|"]
    ignored = []
    for key, spec in KEYS.items():
        if IGNORED in KEY_DOCS[key]:
            ignored.append(key)
            continue
        env = f"`{key.upper()}`, `DOQ_{key.upper().replace('.', '_')}`"
        rows.append(f"| `{key}` | {_TYPES[spec.type]} | {_default(defaults.value(key))} | "
                    f"{env} | {_cell(KEY_DOCS[key])} |")
    rows.append("")
    rows.append("Accepted for compatibility with the original's configuration files and "
                "ignored: " + ", ".join(f"`{key}`" for key in ignored) + ".")
    return "\n".join(rows) + "\n"


def rest_table() -> str:
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    rows = ["| method | path | what it does | key roles |", "|---|---|---|---|"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            roles = re.search(r"With API keys: ([^.]*)", op.get("description", ""))
            rows.append(f"| {method.upper()} | `{path}` | {_cell(op.get('summary', ''))} | "
                        f"{_cell(roles.group(1)) if roles else 'any (no key needed)'} |")
    return "\n".join(rows) + "\n"


def grpc_table() -> str:
    rows = ["| method | request → response | notes |", "|---|---|---|"]
    comment: list[str] = []
    text = (REPO / "proto" / "doq.proto").read_text(encoding="utf-8")
    service = text[text.index("service DOQ"):]
    service = service[:service.index("\n}")]
    for line in service.splitlines():
        line = line.strip()
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        match = re.match(r"rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\)", line)
        if match:
            name, in_stream, request, out_stream, response = match.groups()
            shape = (f"{'stream ' if in_stream else ''}`{request}` → "
                     f"{'stream ' if out_stream else ''}`{response}`")
            note = _cell(" ".join(comment)) or "as the original DOQ"
            rows.append(f"| `{name}` | {shape} | {note} |")
        comment = []
    return "\n".join(rows) + "\n"


GENERATED: dict[str, Callable[[], str]] = {
    "configuration": configuration_table,
    "rest": rest_table,
    "grpc": grpc_table,
}
MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.M)


def expand(markdown: str) -> str:
    """``markdown`` with each marker replaced by its table; an unknown marker is an error."""
    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATED:
            raise ValueError(f"unknown generated table {name!r}: {sorted(GENERATED)}")
        return GENERATED[name]()
    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)
