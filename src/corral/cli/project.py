"""`corral project create|list|set|delete` and `corral queues`: the quota tree.

A project is a queue that workloads are submitted to; a department is a queue with
projects under it. Amounts are GPUs unless the option says CPU or memory; a CPU or
memory quota left out is not managed, and a limit left out is no limit. Rules are given
per workload class (`--idle-timeout interactive=30m`, `--max-runtime train=7d`); a
department's rules apply to its projects that do not set the same rule.
"""

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from corral.cli.common import (
    InvalidInput,
    OutputFormat,
    out_console,
    parse_duration_option,
    parse_memory_option,
    parse_number,
    print_json,
    printed_as_data,
    reported_errors,
)
from corral.cli.config import connect
from corral.cli.pools import PoolDeserved, PoolLimit, pool_quotas, pool_tables, pools_sentence
from corral.model import CLASS_ALIASES, WORKLOAD_CLASSES, format_gpus, format_memory
from corral.model.durations import format_duration
from corral.model.resources import plural_gpus
from corral.sdk.types import Amounts, QueueOut, RuleOut

project_app = typer.Typer(
    help="Projects (and departments, which hold projects) with their quotas.",
    no_args_is_help=True,
)

# What the user typed for `--limit none` and its kin: no limit, or not managed.
NONE = "none"


def _option(flag: str, metavar: str, text: str) -> Any:
    return typer.Option(flag, metavar=metavar, help=text, show_default=False)


Parent = Annotated[str | None, _option("--parent", "DEPT", "The department it belongs to.")]
Deserved = Annotated[str | None, _option("--deserved", "GPUS", "GPUs it is guaranteed.")]
DeservedCpu = Annotated[
    str | None, _option("--deserved-cpu", "CPUS", "CPUs it is guaranteed (none: not managed).")
]
DeservedMemory = Annotated[
    str | None,
    _option(
        "--deserved-memory", "MEMORY", "Memory it is guaranteed, e.g. 256GiB (none: not managed)."
    ),
]
Limit = Annotated[
    str | None, _option("--limit", "GPUS", "At most this many GPUs (none: no limit).")
]
LimitCpu = Annotated[
    str | None, _option("--limit-cpu", "CPUS", "At most this many CPUs (none: no limit).")
]
LimitMemory = Annotated[
    str | None, _option("--limit-memory", "MEMORY", "At most this much memory (none: no limit).")
]
Weight = Annotated[
    str | None,
    _option(
        "--over-quota-weight", "WEIGHT", "Its share of idle GPUs beyond quotas, relative to others."
    ),
]
Priority = Annotated[
    int | None,
    typer.Option(
        "--priority", help="Projects of higher priority get their quota first.", show_default=False
    ),
]
IdleTimeout = Annotated[
    list[str] | None,
    _option(
        "--idle-timeout",
        "CLASS=DURATION",
        "Suspend a workload of this class once all its GPUs have been idle this long, e.g. "
        "interactive=30m (none: no limit). Repeat for more classes.",
    ),
]
MaxRuntime = Annotated[
    list[str] | None,
    _option(
        "--max-runtime",
        "CLASS=DURATION",
        "Stop a workload of this class as failed once it has run this long, e.g. train=7d "
        "(none: no limit). Repeat for more classes.",
    ),
]
PreemptMinRuntime = Annotated[
    str | None,
    _option(
        "--preempt-min-runtime",
        "DURATION",
        "Work that has run for less is not preempted, e.g. 10m (inherit: the parent's). "
        "Its projects inherit it.",
    ),
]
ReclaimMinRuntime = Annotated[
    str | None,
    _option(
        "--reclaim-min-runtime",
        "DURATION",
        "Work that has run for less is not reclaimed, e.g. 10m (inherit: the parent's). "
        "Its projects inherit it.",
    ),
]
FairShareHalfLife = Annotated[
    str | None,
    _option(
        "--fair-share-half-life",
        "DURATION",
        "Time-decayed fair share: GPU-time used lately lowers its share of idle GPUs, "
        "usage halving in weight every DURATION, e.g. 24h (inherit: the parent's). "
        "Its projects inherit it.",
    ),
]
FairShareK = Annotated[
    str | None,
    _option(
        "--fair-share-k",
        "K",
        "Time-decayed fair share: how strongly usage moves its weight (default 1; "
        "inherit: the parent's).",
    ),
]

ReserveAfter = Annotated[
    str | None,
    _option(
        "--reserve-after",
        "DURATION",
        "A workload that waits this long at the head of the project gets a reservation of "
        "the nodes where it fits soonest (backfill), e.g. 30m (inherit: the parent's). "
        "Its projects inherit it.",
    ),
]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print the API's JSON.")]

# A queue's rules as the API takes them: limits in seconds by workload class.
Rules = dict[str, dict[str, float | None]]


class _Quota:
    """One quota's options as given: a field absent from `given` was not on the command
    line; a field given as None was `none`."""

    def __init__(self, given: dict[str, float | None]) -> None:
        self.given = given

    def merged(self, current: Amounts | None) -> dict[str, float | None]:
        amounts: dict[str, float | None] = {}
        if current is not None:
            amounts.update(gpu=current["gpu"], cpu=current["cpu"], memory=current["memory"])
        amounts.update(self.given)
        return {key: value for key, value in amounts.items() if value is not None}


def _part(
    key: str, flag: str, text: str | None, allow_none: bool = True
) -> dict[str, float | None]:
    """One quota option: {} when it was not given, None for `none`."""
    if text is None:
        return {}
    if allow_none and text.strip().lower() == NONE:
        return {key: None}
    if key == "memory":
        return {key: parse_memory_option(flag, text)}
    return {key: parse_number(flag, text, f"a number of {key.upper()}s")}


def _quotas(
    deserved: str | None,
    deserved_cpu: str | None,
    deserved_memory: str | None,
    limit: str | None,
    limit_cpu: str | None,
    limit_memory: str | None,
) -> tuple[_Quota, _Quota]:
    return (
        _Quota(
            _part("gpu", "--deserved", deserved, allow_none=False)
            | _part("cpu", "--deserved-cpu", deserved_cpu)
            | _part("memory", "--deserved-memory", deserved_memory)
        ),
        _Quota(
            _part("gpu", "--limit", limit)
            | _part("cpu", "--limit-cpu", limit_cpu)
            | _part("memory", "--limit-memory", limit_memory)
        ),
    )


def _rule_changes(idle_timeout: list[str] | None, max_runtime: list[str] | None) -> Rules:
    """The rule options as given, by class: a limit in seconds, or None for `none`."""
    changes: Rules = {}
    for flag, field, items in (
        ("--idle-timeout", "idle_timeout", idle_timeout or []),
        ("--max-runtime", "max_runtime", max_runtime or []),
    ):
        for item in items:
            given, equals, text = item.partition("=")
            if not equals or not given:
                raise InvalidInput(f"{flag}: {item!r} is not CLASS=DURATION")
            name = CLASS_ALIASES.get(given, given)
            if name not in WORKLOAD_CLASSES:
                known = ", ".join([*WORKLOAD_CLASSES, *CLASS_ALIASES])
                raise InvalidInput(f"{flag}: {given!r} is not a workload class ({known})")
            limits = changes.setdefault(name, {})
            if field in limits:
                raise InvalidInput(f"{flag}: the {name} class is given twice")
            limits[field] = (
                None if text.strip().lower() == NONE else parse_duration_option(flag, text)
            )
    return changes


def _merged_rules(current: dict[str, RuleOut] | None, changes: Rules) -> Rules:
    """The queue's rules with the changes made; classes left with no limit drop out."""
    rules: Rules = {
        name: {"idle_timeout": limits["idle_timeout"], "max_runtime": limits["max_runtime"]}
        for name, limits in (current or {}).items()
    }
    for name, limits in changes.items():
        rules.setdefault(name, {"idle_timeout": None, "max_runtime": None}).update(limits)
    return {
        name: limits
        for name, limits in rules.items()
        if any(value is not None for value in limits.values())
    }


@project_app.command("create")
def create_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The project's name.", show_default=False)
    ],
    parent: Parent = None,
    deserved: Deserved = None,
    deserved_cpu: DeservedCpu = None,
    deserved_memory: DeservedMemory = None,
    limit: Limit = None,
    limit_cpu: LimitCpu = None,
    limit_memory: LimitMemory = None,
    over_quota_weight: Weight = None,
    priority: Priority = None,
    idle_timeout: IdleTimeout = None,
    max_runtime: MaxRuntime = None,
    preempt_min_runtime: PreemptMinRuntime = None,
    reclaim_min_runtime: ReclaimMinRuntime = None,
    fair_share_half_life: FairShareHalfLife = None,
    fair_share_k: FairShareK = None,
    pool_deserved: PoolDeserved = None,
    pool_limit: PoolLimit = None,
    reserve_after: ReserveAfter = None,
) -> None:
    """Create a project; with --parent, inside a department (which may be new)."""
    with reported_errors(ctx):
        deserved_quota, limit_quota = _quotas(
            deserved, deserved_cpu, deserved_memory, limit, limit_cpu, limit_memory
        )
        rule_changes = _rule_changes(idle_timeout, max_runtime)
        body: dict[str, Any] = {"name": name, "parent": parent}
        body["deserved"] = deserved_quota.merged(None)
        if limits := limit_quota.merged(None):
            body["limit"] = limits
        if over_quota_weight is not None:
            body["over_quota_weight"] = parse_number(
                "--over-quota-weight", over_quota_weight, "a weight"
            )
        if priority is not None:
            body["priority"] = priority
        body.update(_min_runtimes(preempt_min_runtime, reclaim_min_runtime))
        body.update(_fair_share(fair_share_half_life, fair_share_k))

        if (pools := pool_quotas(pool_deserved, pool_limit)) is not None:
            body["pools"] = pools

        body.update(_reserve_after(reserve_after))
        if rules := _merged_rules(None, rule_changes):
            body["rules"] = rules
        with connect() as client:
            queue = client.create_queue(body)
    where = f" in {queue['parent']}" if queue["parent"] else ""
    typer.echo(
        f"Created project {queue['name']}{where}: deserved {_amounts(queue['deserved'])}, "
        f"limit {_amounts(queue['limit'], empty='none')}."
        f"{pools_sentence(queue)}{_min_runtime_sentence(queue)}{_fair_share_sentence(queue)}"
        f"{_reserve_sentence(queue)}{_rules_sentence(queue)}"
    )


@project_app.command("set")
def set_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The project or department.", show_default=False)
    ],
    parent: Parent = None,
    deserved: Deserved = None,
    deserved_cpu: DeservedCpu = None,
    deserved_memory: DeservedMemory = None,
    limit: Limit = None,
    limit_cpu: LimitCpu = None,
    limit_memory: LimitMemory = None,
    over_quota_weight: Weight = None,
    priority: Priority = None,
    idle_timeout: IdleTimeout = None,
    max_runtime: MaxRuntime = None,
    preempt_min_runtime: PreemptMinRuntime = None,
    reclaim_min_runtime: ReclaimMinRuntime = None,
    fair_share_half_life: FairShareHalfLife = None,
    fair_share_k: FairShareK = None,
    pool_deserved: PoolDeserved = None,
    pool_limit: PoolLimit = None,
    reserve_after: ReserveAfter = None,
) -> None:
    """Change some of a project's settings; the others stay as they are."""
    with reported_errors(ctx):
        deserved_quota, limit_quota = _quotas(
            deserved, deserved_cpu, deserved_memory, limit, limit_cpu, limit_memory
        )
        rule_changes = _rule_changes(idle_timeout, max_runtime)
        changes: dict[str, Any] = {}
        if parent is not None:
            changes["parent"] = parent
        if over_quota_weight is not None:
            changes["over_quota_weight"] = parse_number(
                "--over-quota-weight", over_quota_weight, "a weight"
            )
        if priority is not None:
            changes["priority"] = priority
        changes.update(_min_runtimes(preempt_min_runtime, reclaim_min_runtime))
        changes.update(_fair_share(fair_share_half_life, fair_share_k))

        pools_given = bool(pool_deserved or pool_limit)
        # Checked before anything is sent.
        pool_quotas(pool_deserved, pool_limit)

        changes.update(_reserve_after(reserve_after))
        with connect() as client:
            if deserved_quota.given or limit_quota.given or rule_changes or pools_given:
                # The API replaces a quota or the rules whole; merge so that --limit-cpu
                # keeps the GPU limit, and a rule for one class keeps the others.
                current = client.get_queue(name)
                if deserved_quota.given:
                    changes["deserved"] = deserved_quota.merged(current["deserved"])
                if limit_quota.given:
                    changes["limit"] = limit_quota.merged(current["limit"]) or None
                if rule_changes:
                    changes["rules"] = _merged_rules(current["rules"], rule_changes)
                if pools_given:
                    changes["pools"] = pool_quotas(pool_deserved, pool_limit, current["pools"])
            if not changes:
                raise InvalidInput("give at least one setting to change (see --help)")
            queue = client.update_queue(name, changes)
    typer.echo(
        f"Updated {queue['name']}: deserved {_amounts(queue['deserved'])}, "
        f"limit {_amounts(queue['limit'], empty='none')}, "
        f"over-quota weight {_weight(queue)}, priority {queue['priority']}."
        f"{pools_sentence(queue)}{_min_runtime_sentence(queue)}{_fair_share_sentence(queue)}"
        f"{_reserve_sentence(queue)}{_rules_sentence(queue)}"
    )


@project_app.command("delete")
def delete_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The project or department.", show_default=False)
    ],
) -> None:
    """Delete a project (a department only once its projects are gone)."""
    with reported_errors(ctx), connect() as client:
        client.delete_queue(name)
    typer.echo(f"Deleted {name}.")


@project_app.command("list")
def list_command(ctx: typer.Context, json_output: JsonOutput = False) -> None:
    """Projects and departments as a tree, with their quotas."""
    with reported_errors(ctx), connect() as client:
        queues = client.list_queues()
    if json_output:
        print_json(queues)
        return
    table = Table()
    table.add_column("project")
    for column in ("deserved", "limit", "over-quota weight", "priority"):
        table.add_column(column, justify="right")
    table.add_column("rules")
    for label, queue in _tree_rows(queues):
        table.add_row(
            label,
            _amounts(queue["deserved"]),
            _amounts(queue["limit"], empty="none"),
            _weight(queue),
            str(queue["priority"]),
            _rules_text(queue["rules"]) or "-",
        )
    out_console().print(table)


def queues_command(
    ctx: typer.Context, json_output: JsonOutput = False, output: OutputFormat = "table"
) -> None:
    """Per project and department: GPUs deserved, fair share, allocated, pending, limit."""
    with reported_errors(ctx), connect() as client:
        queues = client.list_queues()
        if printed_as_data(queues, output, json_output):
            return
    table = Table(title="Queues (GPUs)", title_justify="left")
    table.add_column("queue")
    for column in ("deserved", "fair share", "allocated", "pending", "limit"):
        table.add_column(column, justify="right")
    wide = output == "wide"
    if wide:
        for column in ("over-quota weight", "priority", "cpu allocated", "memory allocated"):
            table.add_column(column, justify="right")
    for label, queue in _tree_rows(queues):
        allocated = queue["allocated"]["gpu"] if queue["allocated"] else None
        # Beyond deserved, GPUs are borrowed and may be reclaimed by their owners.
        borrowing = allocated is not None and allocated > (queue["deserved"]["gpu"] or 0)
        table.add_row(
            label,
            _gpu(queue["deserved"]),
            _gpu(queue["fair_share"]),
            Text(_gpu(queue["allocated"]), style="yellow" if borrowing else ""),
            "-" if queue["pending_gpu"] is None else format_gpus(queue["pending_gpu"]),
            _gpu(queue["limit"], empty="none"),
            *(wide_queue_cells(queue) if wide else ()),
        )
    console = out_console()
    console.print(table)
    for pool_table in pool_tables(queues):
        console.print(pool_table)
    if any(queue["fair_share"] is None for queue in queues):
        console.print(Text("Fair shares appear after the scheduler's next cycle.", style="dim"))


def wide_queue_cells(queue: QueueOut) -> tuple[str, ...]:
    """The cells `corral queues -o wide` adds."""
    allocated = queue["allocated"]
    weight = f"{queue['over_quota_weight']['gpu']:g}"
    # Time-decayed fair share: the weight the latest cycle divided the surplus by.
    effective = queue.get("effective_weight")
    if effective is not None and abs(effective - queue["over_quota_weight"]["gpu"]) > 1e-9:
        weight += f" → {effective:.2g}"
    return (
        weight,
        str(queue["priority"]),
        "-" if allocated is None else format_gpus(allocated["cpu"] or 0),
        "-" if allocated is None else format_memory(int(allocated["memory"] or 0)),
    )


def _tree_rows(queues: list[QueueOut]) -> list[tuple[Text, QueueOut]]:
    """Each queue under its department, with tree guides, in name order."""
    children: dict[str | None, list[QueueOut]] = {}
    for queue in sorted(queues, key=lambda q: q["name"]):
        children.setdefault(queue["parent"], []).append(queue)
    rows: list[tuple[Text, QueueOut]] = []

    def visit(parent: str | None, guides: str) -> None:
        siblings = children.get(parent, [])
        for index, queue in enumerate(siblings):
            last = index == len(siblings) - 1
            branch = "" if parent is None else ("└── " if last else "├── ")
            label = Text(guides + branch + queue["name"])
            if queue["department"]:
                label.append(" (department)", style="dim")
            rows.append((label, queue))
            below = "" if parent is None else ("    " if last else "│   ")
            visit(queue["name"], guides + below)

    visit(None, "")
    return rows


def _gpu(amounts: Amounts | None, empty: str = "-") -> str:
    if amounts is None or amounts["gpu"] is None:
        return empty
    return format_gpus(amounts["gpu"])


def _amounts(amounts: Amounts, empty: str = "0 GPUs") -> str:
    """ "4 GPUs", or "4 GPUs, 16 CPUs, 64GiB" when CPU and memory are managed too."""
    parts = []
    if amounts["gpu"] is not None:
        parts.append(plural_gpus(amounts["gpu"]))
    if amounts["cpu"] is not None:
        parts.append(f"{amounts['cpu']:g} CPUs")
    if amounts["memory"] is not None:
        parts.append(format_memory(amounts["memory"]))
    return ", ".join(parts) or empty


def _rules_text(rules: dict[str, RuleOut]) -> str:
    """ "build: idle 30m; train: max runtime 7d" (classes in the API's order)."""
    parts = []
    for name, limits in rules.items():
        given = []
        if limits["idle_timeout"] is not None:
            given.append(f"idle {format_duration(limits['idle_timeout'])}")
        if limits["max_runtime"] is not None:
            given.append(f"max runtime {format_duration(limits['max_runtime'])}")
        if given:
            parts.append(f"{name}: {', '.join(given)}")
    return "; ".join(parts)


def _rules_sentence(queue: QueueOut) -> str:
    text = _rules_text(queue["rules"])
    return f" Rules: {text}." if text else ""


def _min_runtimes(preempt: str | None, reclaim: str | None) -> dict[str, float | None]:
    """The min-runtime fields given, in seconds; "inherit" is null (the parent's)."""
    fields: dict[str, float | None] = {}
    for field, flag, text in (
        ("preempt_min_runtime", "--preempt-min-runtime", preempt),
        ("reclaim_min_runtime", "--reclaim-min-runtime", reclaim),
    ):
        if text is not None:
            inherit = text.strip().lower() == "inherit"
            fields[field] = None if inherit else parse_duration_option(flag, text)
    return fields


def _fair_share(half_life: str | None, k: str | None) -> dict[str, float | None]:
    """The time-decayed fair share fields given; "inherit" is null (the parent's)."""
    fields: dict[str, float | None] = {}
    if half_life is not None:
        inherit = half_life.strip().lower() == "inherit"
        fields["fair_share_half_life"] = (
            None if inherit else parse_duration_option("--fair-share-half-life", half_life)
        )
    if k is not None:
        inherit = k.strip().lower() == "inherit"
        fields["fair_share_k"] = (
            None if inherit else parse_number("--fair-share-k", k, "a usage factor")
        )
    return fields


def _fair_share_sentence(queue: QueueOut) -> str:
    """ " Time-decayed fair share: half-life 1d, k 2." for what is set on the queue."""
    parts = []
    if (half_life := queue.get("fair_share_half_life")) is not None:
        parts.append(f"half-life {format_duration(half_life)}")
    if (k := queue.get("fair_share_k")) is not None:
        parts.append(f"k {k:g}")
    return f" Time-decayed fair share: {', '.join(parts)}." if parts else ""


def _reserve_after(text: str | None) -> dict[str, float | None]:
    """The reserve_after field if given, in seconds; "inherit" is null (the parent's)."""
    if text is None:
        return {}
    if text.strip().lower() == "inherit":
        return {"reserve_after": None}
    return {"reserve_after": parse_duration_option("--reserve-after", text)}


def _reserve_sentence(queue: QueueOut) -> str:
    """ " Reserves after 30m." when the queue itself sets reserve_after."""
    seconds = queue.get("reserve_after")
    return "" if seconds is None else f" Reserves after {format_duration(seconds)}."


def _min_runtime_sentence(queue: QueueOut) -> str:
    """ " Preempt min-runtime 10m; reclaim min-runtime 10m." for those set on the queue."""
    parts = [
        f"{kind} min-runtime {format_duration(seconds)}"
        for kind, seconds in (
            ("preempt", queue.get("preempt_min_runtime")),
            ("reclaim", queue.get("reclaim_min_runtime")),
        )
        if seconds is not None
    ]
    return f" {'; '.join(parts).capitalize()}." if parts else ""


def _weight(queue: QueueOut) -> str:
    weight = queue["over_quota_weight"]["gpu"]
    return "-" if weight is None else f"{weight:g}"
