"""corral.sdk.types is generated from the API's OpenAPI document (corral.server.typegen).
These tests are the drift check: they fail when the committed module and the API differ."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.server import typegen


def test_the_committed_sdk_types_are_what_the_api_generates() -> None:
    generated = typegen.render(typegen.openapi_document())
    assert typegen.TARGET.read_text() == generated, (
        "corral/sdk/types.py differs from the API: run python -m corral.server.typegen"
    )


def test_the_check_command_fails_on_drift(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stale = tmp_path / "types.py"
    stale.write_text("# an old version\n")
    monkeypatch.setattr(typegen, "TARGET", stale)
    assert typegen.main(["--check"]) == 1
    assert typegen.main([]) == 0
    assert typegen.main(["--check"]) == 0


def test_schemas_become_typed_dictionaries() -> None:
    document = {
        "paths": {
            "/a": {
                "get": {
                    "responses": {
                        "200": {
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/AOut"},
                                    }
                                }
                            }
                        }
                    }
                }
            },
        },
        "components": {
            "schemas": {
                "AOut": {
                    "description": "An answer.",
                    "properties": {
                        "kind": {"type": "string", "enum": ["x", "y"], "description": "which"},
                        "b": {"anyOf": [{"$ref": "#/components/schemas/BOut"}, {"type": "null"}]},
                        "extra": {"type": "object"},
                    },
                },
                "BOut": {
                    "properties": {
                        "n": {"additionalProperties": {"type": "integer"}, "type": "object"}
                    }
                },
                "Unused": {"properties": {"z": {"type": "string"}}},
                "UserIn": {"properties": {"role": {"enum": ["admin"]}}},
                "WorkloadOut": {"properties": {"status": {"enum": ["pending"]}}},
            }
        },
    }
    source = typegen.render(document)
    assert "class Unused" not in source and "class UserIn" not in source
    assert 'class AOut(TypedDict):\n    """An answer."""\n\n    # which\n' in source
    assert '    kind: Literal["x", "y"]\n    b: BOut | None\n    extra: dict[str, Any]\n' in source
    assert "class BOut(TypedDict):\n    n: dict[str, int]\n" in source
    assert 'Role = Literal["admin"]' in source
    assert "from typing import Any, Literal, TypedDict" in source


def test_the_sdk_imports_no_server_code() -> None:
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, corral.sdk; print(' '.join(sorted(m for m in sys.modules"
            " if m.startswith('corral.') and not m.startswith(('corral.sdk', 'corral.model')))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == ""
