"""Generate `corral.sdk.types` from the server's OpenAPI document.

The SDK types every JSON body the API answers with as a TypedDict of the same name as its
schema. They are generated, not written by hand, so that they cannot drift from the API:

    python -m corral.server.typegen          # rewrite src/corral/sdk/types.py
    python -m corral.server.typegen --check  # exit 1 when it differs (CI runs the same
                                             # comparison in tests/server/test_sdk_types.py)

The generator lives in the server because it needs the application; the generated module
imports nothing of corral, so the SDK never imports server code.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.server.app import create_app
from corral.store import Store, database_url

TARGET = Path(__file__).resolve().parents[1] / "sdk" / "types.py"
REF = "#/components/schemas/"
WIDTH = 100
# Names that users' code and the CLI use for enumerations of the API, by the schema and
# field whose values they take.
ALIASES = {"WorkloadStatus": ("WorkloadOut", "status"), "Role": ("UserIn", "role")}
HEADER = '''"""The JSON bodies the corral API answers with, as typed dictionaries.

Generated from the server's OpenAPI document by `python -m corral.server.typegen`: do not
edit by hand. Users' code (and the CLI, which prints them with --json) gets the API's JSON
unchanged but typed. Every field is present in an answer, defaults included.
"""

from __future__ import annotations
'''
SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of an application over an empty, throwaway store."""
    with tempfile.TemporaryDirectory() as folder:
        store = Store(database_url(Path(folder), None))
        try:
            return create_app(store, run_scheduler=False).openapi()
        finally:
            store.close()


def answered_schemas(document: dict[str, Any]) -> list[str]:
    """Names of the schemas that successful answers use, directly or inside others, in the
    document's order."""
    schemas = document["components"]["schemas"]
    found: set[str] = set()
    pending = [
        media["schema"]
        for operations in document["paths"].values()
        for operation in operations.values()
        for status, response in operation.get("responses", {}).items()
        if status.startswith("2")
        for media in response.get("content", {}).values()
        if "schema" in media
    ]
    while pending:
        for name in _refs(pending.pop()):
            if name not in found:
                found.add(name)
                pending.append(schemas[name])
    return [name for name in schemas if name in found]


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            yield ref[len(REF) :]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


class _Writer:
    """Python type expressions for JSON schemas, noting what `typing` must give."""

    def __init__(self, aliases: dict[tuple[str, ...], str]) -> None:
        self.aliases = aliases
        self.typing: set[str] = {"TypedDict"}

    def type_of(self, schema: dict[str, Any]) -> str:
        if "$ref" in schema:
            return str(schema["$ref"])[len(REF) :]
        if "enum" in schema:
            values = tuple(schema["enum"])
            if values in self.aliases:
                return self.aliases[values]
            return self.literal(values)
        if "anyOf" in schema:
            return " | ".join(self.type_of(option) for option in schema["anyOf"])
        kind = schema.get("type")
        if kind == "array":
            return f"list[{self.type_of(schema.get('items', {}))}]"
        if kind == "object":
            items = schema.get("additionalProperties")
            return f"dict[str, {self.type_of(items if isinstance(items, dict) else {})}]"
        if isinstance(kind, str) and kind in SCALARS:
            return SCALARS[kind]
        self.typing.add("Any")
        return "Any"

    def literal(self, values: tuple[Any, ...]) -> str:
        self.typing.add("Literal")
        return f"Literal[{', '.join(_literal(value) for value in values)}]"


def _literal(value: Any) -> str:
    """A value in a Literal[...], strings in double quotes as the formatter writes them."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _docstring(text: str) -> list[str]:
    """A class docstring, wrapped as the formatter leaves it."""
    words = " ".join(text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').split())
    if len(words) + 10 <= WIDTH:
        return [f'    """{words}"""', ""]
    lines = textwrap.wrap(words, WIDTH - 7)
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return [f"    {line}" for line in lines] + [""]


def _comment(text: str) -> list[str]:
    return [f"    # {line}" for line in textwrap.wrap(" ".join(text.split()), WIDTH - 6)]


def render(document: dict[str, Any]) -> str:
    """The source of `corral.sdk.types` for an OpenAPI document."""
    schemas = document["components"]["schemas"]
    aliases = {
        tuple(schemas[schema]["properties"][field]["enum"]): name
        for name, (schema, field) in ALIASES.items()
    }
    writer = _Writer(aliases)
    blocks = []
    for name in answered_schemas(document):
        schema = schemas[name]
        lines = [f"class {name}(TypedDict):"]
        if "description" in schema:
            lines += _docstring(schema["description"])
        for field, spec in schema["properties"].items():
            if "description" in spec:
                lines += _comment(spec["description"])
            lines.append(f"    {field}: {writer.type_of(spec)}")
        blocks.append("\n".join(lines))
    alias_lines = [f"{name} = {writer.literal(values)}" for values, name in aliases.items()]
    imports = f"from typing import {', '.join(sorted(writer.typing))}"
    return (
        "\n\n\n".join([HEADER + "\n" + imports + "\n\n" + "\n".join(alias_lines), *blocks]) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Write the generated module, or with --check report whether it is up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when types.py differs")
    args = parser.parse_args(argv)
    source = render(openapi_document())
    if args.check:
        if TARGET.read_text() != source:
            print(f"{TARGET} differs from the API; run python -m corral.server.typegen")
            return 1
        return 0
    TARGET.write_text(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
