"""MkDocs hook: the HTTP API's reference page, generated from its OpenAPI document.

``<!-- http api, generated -->`` becomes each route of ``docs/reference/openapi.json`` (the
document ``duetime serve`` serves, which a test compares with what it serves): its method and
path, what it does, the scope it needs, its parameters, its request body's fields and its answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MARKER = "<!-- http api, generated -->"
DOCUMENT = Path(__file__).resolve().parents[1] / "reference" / "openapi.json"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(json.loads(DOCUMENT.read_text())))


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _kind(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "anyOf" in schema:
        return " or ".join(_kind(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_kind(schema.get('items', {}))}"
    if schema.get("type") == "object" and "additionalProperties" in schema:
        return "object of text"
    kind = str(schema.get("format") or schema.get("type") or "any")
    if "enum" in schema:
        kind += " (" + ", ".join(str(v) for v in schema["enum"]) + ")"
    return kind


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | | |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        need = "required" if name in required else ""
        rows.append(f"| `{name}` | {_cell(_kind(prop))} | {need} | {_cell(prop.get('description', ''))} |")
    together = schema.get("oneOf")
    if together:
        groups = [" and ".join(f"`{n}`" for n in g.get("required", [])) for g in together]
        rows.append(f"\nExactly one of {', '.join(groups)}.")
    return rows


def render(document: dict[str, Any]) -> str:
    schemas = document["components"]["schemas"]
    out: list[str] = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            out.append(f"### `{method.upper()} {path}`\n")
            out.append(f"{op.get('summary', '')}. {op.get('description', '')}".strip() + "\n")
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | |", "|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(_kind(p.get('schema', {})))} | "
                        f"{_cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                name = _kind(body)
                out.append(f"Body: `{name}`\n")
                out += _fields(schemas.get(name, body))
                out.append("")
            answers = ", ".join(
                f"`{status}`" for status in op.get("responses", {}) if not status.startswith(("4", "5"))
            )
            problems = ", ".join(f"`{s}`" for s in op.get("responses", {}) if s.startswith(("4", "5")))
            out.append(f"Answers {answers}; problems {problems}.\n")
    out.append("## Schemas\n")
    for name, schema in schemas.items():
        out.append(f"### `{name}`\n")
        if schema.get("description"):
            out.append(_cell(schema["description"]) + "\n")
        out += _fields(schema)
        out.append("")
    return "\n".join(out)
