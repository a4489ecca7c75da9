"""Read YAML that someone else wrote, within bounds.

`corral plan`, `corral simulate` and `corral apply` read files a user was handed. PyYAML
alone lets a small file cost without limit: a "billion laughs" file (aliases of aliases)
expands to 10^9 values for whoever walks or serialises it, a few thousand nested brackets
overflow Python's stack, a self-referencing alias builds a cycle that JSON cannot encode,
and some plain scalars (`2001-13-45`, an integer of 5000 digits) fail with ValueError
instead of a YAML error. `BoundedLoader` counts while it composes and refuses each of these
with a `yaml.MarkedYAMLError` (line and column where known), so callers that already turn
YAML errors into one clear line need nothing more.

The rule for aliases, in plain words: what a file writes out itself is bounded by its
bytes, and MAX_BYTES bounds those; what its aliases add is bounded on its own. Each
alias stands for a copy of the node it names, so it adds that node's values (counted once,
when the node was composed, and never expanded here). Over the whole stream the aliases
may add at most MAX_ALIAS_VALUES values: an ordinary file, however large, has nothing to
count against it, and one that reuses an anchor a few hundred times is far below; a
"billion laughs" passes the bound within a few lines and is refused there, before the
rest of the file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import yaml
from yaml.events import AliasEvent

# Room for a scenario of a few thousand nodes and ten thousand workloads (the openb
# cluster, 1,213 nodes and 8,152 pods, is 1.3 MB and plans in 180 MB). PyYAML holds about
# 0.7 KB per value it reads, so the bytes bound what a file written out costs: at worst,
# 2 MiB of one-character values, about 0.7 GB.
MAX_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 50
# What the aliases of a stream may add to the values it writes itself, all expanded: what
# a reader that walks or serialises the documents visits beyond what it read.
MAX_ALIAS_VALUES = 100_000


class YamlLimitError(yaml.MarkedYAMLError):
    """The YAML exceeds one of the bounds; `problem` says which, `problem_mark` where."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses input over MAX_BYTES, nesting deeper than MAX_DEPTH,
    aliases that add more than MAX_ALIAS_VALUES values once expanded, aliases that refer to
    a node containing them, and scalars whose conversion fails. The count of what aliases
    add runs over the whole stream, so many small documents cannot add up past the bound."""

    def __init__(self, stream: str | bytes | IO[str] | IO[bytes]) -> None:
        if isinstance(stream, str | bytes) and len(stream) > MAX_BYTES:
            raise YamlLimitError(_too_large())
        super().__init__(stream)
        self._depth = 0
        # The running count of values with aliases expanded; a node's own weight is the
        # count after it minus the count before it.
        self._expanded = 0
        # The part of that count the aliases added: the expansion beyond what is written.
        self._added = 0
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
        self._expanded += 1
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
        target = self.anchors.get(event.anchor) if event.anchor is not None else None
        if target is not None:
            weight = self._weights.get(id(target))
            if weight is None:
                raise YamlLimitError(
                    f"alias *{event.anchor} refers to a node that contains it", event.start_mark
                )
            self._expanded += weight
            self._added += weight
            if self._added > MAX_ALIAS_VALUES:
                raise YamlLimitError(
                    f"aliases expand the file by more than {MAX_ALIAS_VALUES} values"
                    " (an alias bomb)",
                    event.start_mark,
                )
        # An undefined alias is PyYAML's own error, raised here.
        node = super().compose_node(None, 0)
        assert node is not None
        return node

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
