"""Read YAML that someone else wrote, within bounds.

`corral plan`, `corral simulate` and `corral apply` read files a user was handed. PyYAML
alone lets a small file cost without limit: a "billion laughs" file (aliases of aliases)
expands to 10^9 values for whoever walks or serialises it, a few thousand nested brackets
overflow Python's stack, a self-referencing alias builds a cycle that JSON cannot encode,
and some plain scalars (`2001-13-45`, an integer of 5000 digits) fail with ValueError
instead of a YAML error. `BoundedLoader` counts while it composes and refuses each of these
with a `yaml.MarkedYAMLError` (line and column where known), so callers that already turn
YAML errors into one clear line need nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import yaml
from yaml.events import AliasEvent

# Far above any real scenario or workload file (the largest example is a few KB), far
# below what costs memory: PyYAML holds about 0.5 KB per composed node.
MAX_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 50
MAX_ALIASES = 1000
# Values once every alias is expanded: what a reader that walks the document visits.
MAX_NODES = 50_000


class YamlLimitError(yaml.MarkedYAMLError):
    """The YAML exceeds one of the bounds; `problem` says which, `problem_mark` where."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses input over MAX_BYTES, nesting deeper than MAX_DEPTH, more
    than MAX_ALIASES aliases, more than MAX_NODES values with aliases expanded, aliases
    that refer to a node containing them, and scalars whose conversion fails. The counts
    run over the whole stream, so many small documents cannot add up past the bounds."""

    def __init__(self, stream: str | bytes | IO[str] | IO[bytes]) -> None:
        if isinstance(stream, str | bytes) and len(stream) > MAX_BYTES:
            raise YamlLimitError(_too_large())
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        # The running count of values with aliases expanded; a node's own weight is the
        # count after it minus the count before it.
        self._expanded = 0
        # Weights of the anchored nodes composed so far, by id: an anchor without a weight
        # yet is still being composed, so an alias to it is a cycle.
        self._weights: dict[int, int] = {}

    def compose_document(self) -> yaml.Node | None:
        """Compose the next document; anchors (and so their weights) are per document."""
        self._weights.clear()
        node: yaml.Node | None = super().compose_document()
        return node

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose one node (and, through PyYAML's recursion, its children), counting."""
        # PyYAML's events are untyped; only their marks and anchors are read here.
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            return self._alias(event)
        if self._depth >= MAX_DEPTH:
            raise YamlLimitError(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        before = self._expanded
        self._count(1, event.start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
            assert node is not None  # only an empty stream composes to None
        finally:
            self._depth -= 1
        if getattr(event, "anchor", None) is not None:
            self._weights[id(node)] = self._expanded - before
        return node

    def _alias(self, event: Any) -> yaml.Node:
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            raise YamlLimitError(f"more than {MAX_ALIASES} aliases", event.start_mark)
        target = self.anchors.get(event.anchor) if event.anchor is not None else None
        if target is not None:
            weight = self._weights.get(id(target))
            if weight is None:
                raise YamlLimitError(
                    f"alias *{event.anchor} refers to a node that contains it", event.start_mark
                )
            self._count(weight, event.start_mark)
        # An undefined alias is PyYAML's own error, raised here.
        node = super().compose_node(None, 0)
        assert node is not None
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._expanded += nodes
        if self._expanded > MAX_NODES:
            raise YamlLimitError(f"more than {MAX_NODES} values once aliases are expanded", mark)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Build a node's value; a scalar PyYAML resolves but cannot convert (a date
        like 2001-13-45, an integer of thousands of digits) is a YAML error, not a
        ValueError."""
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as error:
            value = node.value if isinstance(node, yaml.ScalarNode) else ""
            shown = value if len(value) <= 40 else value[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown!r}: {str(error)[:120]}", node.start_mark
            ) from None


def read_text(source: str | Path | IO[str]) -> str:
    """The text of a file (or an open text stream, such as stdin), reading no more than
    MAX_BYTES + 1 bytes of it. Raises YamlLimitError when there is more, OSError and
    UnicodeDecodeError as reading does."""
    if isinstance(source, str | Path):
        with open(source, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise YamlLimitError(_too_large())
        return data.decode("utf-8")
    text = source.read(MAX_BYTES + 1)
    if len(text) > MAX_BYTES:
        raise YamlLimitError(_too_large())
    return text


def _too_large() -> str:
    return f"larger than {MAX_BYTES // (1024 * 1024)} MiB"
