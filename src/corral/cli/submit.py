"""`corral submit` and `corral apply -f`: new workloads, from options or from YAML.

Both send the API's WorkloadIn fields. Option values are checked here, so that a bad
`-g` is a usage error naming the option; the fields of a file are checked by the server,
whose answer names each bad field.
"""

import json
import os
import re
import sys
from typing import Annotated, Any

import typer
import yaml
from typer.core import TyperCommand

from corral.cli.common import (
    InvalidInput,
    parse_duration_option,
    parse_memory_option,
    parse_number,
    parse_pairs,
    reported_errors,
    secret_refs,
)
from corral.cli.config import connect
from corral.cli.environment import exported, secrets_left_out
from corral.cli.lifecycle import lifecycle_fields, submitted_text
from corral.cli.travel import bring_code, read_python_field, travel_fields
from corral.model import PRIORITY_CLASSES, resolve_priority
from corral.scenario.yamlio import BoundedLoader, YamlLimitError, read_text
from corral.sdk import ApiError, Client
from corral.sdk.types import WorkloadOut

PORT_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Where SubmitCommand leaves the words after "--" for submit_command.
_COMMAND = "corral.submit.command"


class SubmitCommand(TyperCommand):
    """`corral submit [NAME] [OPTIONS] -- COMMAND ARGS...`.

    Click would give the first word after "--" to NAME when NAME is left out, so the
    command is split off before click parses the rest. (`ctx` is the click Context that
    typer vendors privately, hence Any.)
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            ctx.meta[_COMMAND] = args[split + 1 :]
            args = args[:split]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "-- COMMAND [ARGS]..."]


def port_names(names: list[str]) -> list[str]:
    """--port: names the API takes (lowercase, a letter first), each once."""
    found: list[str] = []
    for name in names:
        if not PORT_NAME.match(name) or len(name) > 31:
            raise InvalidInput(
                f"--port: {name!r}: lowercase letters, digits and '-', starting with a letter"
            )
        if name in found:
            raise InvalidInput(f"--port: {name!r} given twice")
        found.append(name)
    return found


def parse_gpus(text: str) -> float:
    """-g: whole devices ("2") or a fraction of one ("0.5")."""
    gpus = parse_number("-g/--gpu", text, "a number of GPUs (e.g. 1, 2 or 0.5)")
    if gpus >= 1 and gpus != int(gpus):
        raise InvalidInput(f"-g/--gpu: {text!r}: 1 GPU or more must be a whole number")
    return gpus


def submit_command(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="NAME", help="The workload's name (made up when left out).", show_default=False
        ),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project", "-p", help="The project to submit to.", show_default="your project"
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu", "-g", metavar="GPUS", help="GPUs per worker: 1, 2, ... or a fraction, 0.5."
        ),
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory", metavar="MEMORY", help="A share of one GPU by its memory, e.g. 20GiB."
        ),
    ] = None,
    cpu: Annotated[
        str | None, typer.Option("--cpu", metavar="CPUS", help="CPUs per worker.")
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option("--memory", metavar="MEMORY", help="Memory per worker, e.g. 64GiB."),
    ] = None,
    workers: Annotated[
        int,
        typer.Option("--workers", min=1, help="Start this many workers together, as a gang."),
    ] = 1,
    min_workers: Annotated[
        int | None,
        typer.Option(
            "--min-workers",
            min=1,
            help="Elastic: start with this many, more as GPUs free up.",
            show_default=False,
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            metavar="CLASS|N",
            help=f"{', '.join(PRIORITY_CLASSES)}, or a number.",
            show_default="train",
        ),
    ] = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", help="Interactive work: the build priority class.")
    ] = False,
    preemptible: Annotated[
        bool | None,
        typer.Option(
            "--preemptible/--non-preemptible",
            help="May it be stopped for higher-priority work?",
            show_default="preemptible below the build class",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", metavar="KEY=VALUE", help="An environment variable."),
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            "--secret",
            metavar="NAME|VAR=NAME",
            help="A secret of the project (see `corral secret`) in the variable of its "
            "name, or in VAR. Its value is decrypted only for the task, never shown.",
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option("--workdir", metavar="DIR", help="The directory to run in, on the node."),
    ] = None,
    code: Annotated[
        str | None,
        typer.Option(
            "--code",
            metavar="DIR",
            help="Bring this directory's files (less .gitignore's and .corralignore's): "
            "each task starts in its own copy of them, on whichever node it lands.",
        ),
    ] = None,
    requirements: Annotated[
        str | None,
        typer.Option(
            "--requirements",
            metavar="FILE",
            help="A Python environment the node builds with uv (once per node for all "
            "who ask the same): requirements.txt, or a pyproject.toml / uv.lock.",
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option("--python", metavar="VERSION", help="Its Python version, e.g. 3.11."),
    ] = None,
    index_url: Annotated[
        str | None,
        typer.Option("--index-url", metavar="URL", help="The package index to install from."),
    ] = None,
    find_links: Annotated[
        list[str] | None,
        typer.Option(
            "--find-links", metavar="URL", help="A page of links to packages. Repeatable."
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="IMAGE",
            help="Run its tasks in this OCI image (podman), as your own uid inside.",
        ),
    ] = None,
    max_runtime: Annotated[
        str | None,
        typer.Option(
            "--max-runtime", metavar="DURATION", help="Stop it after this long: 90m, 4h, 2d."
        ),
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--node-selector",
            metavar="KEY=VALUE",
            help="Only nodes with this label; a key given twice accepts either value.",
        ),
    ] = None,
    node_pool: Annotated[
        list[str] | None,
        typer.Option(
            "--node-pool",
            metavar="POOL",
            help="A node pool it may run in; repeat in order of preference (default: any).",
        ),
    ] = None,
    topology: Annotated[
        str | None,
        typer.Option(
            "--topology",
            metavar="LABEL",
            help="All workers on nodes that share this label's value, e.g. rack.",
        ),
    ] = None,
    topology_preferred: Annotated[
        str | None,
        typer.Option(
            "--topology-preferred",
            metavar="LABEL",
            help="Like --topology, but only preferred.",
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            "--array",
            metavar="INDICES[%LIMIT]",
            help="One workload per index, NAME-INDEX, with CORRAL_ARRAY_INDEX set: "
            "0-99%8 (at most 8 running at once), 1,3,5-7.",
        ),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after",
            metavar="NAME[:ok|any]",
            help="Wait until NAME succeeded (ok, the default) or ended (any). Repeatable.",
        ),
    ] = None,
    kill_on_invalid_dep: Annotated[
        bool,
        typer.Option(
            "--kill-on-invalid-dep",
            help="Cancel it when a dependency can no longer be met (default: it waits).",
        ),
    ] = False,
    port: Annotated[
        list[str] | None,
        typer.Option(
            "--port",
            metavar="NAME",
            help="A port its task listens on (CORRAL_PORT_<NAME>), reached through the "
            "server at /w/WORKLOAD/NAME/; main is /w/WORKLOAD/. Repeatable.",
        ),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export",
            metavar="ALL|NONE|VAR,...",
            help="Which of this shell's variables the task gets: ALL (less secrets by "
            "name or value, CORRAL_* and the login session's), NONE, or the ones named.",
            show_default="ALL; NONE with --image",
        ),
    ] = None,
    grace_period: Annotated[
        str | None,
        typer.Option(
            "--grace-period",
            metavar="DURATION",
            help="From SIGTERM to SIGKILL when it is stopped or preempted: 30, 2m.",
            show_default="30s",
        ),
    ] = None,
    backoff_limit: Annotated[
        int | None,
        typer.Option(
            "--backoff-limit",
            min=0,
            max=100,
            help="Start it again this many times when it fails.",
            show_default="0",
        ),
    ] = None,
    task_group: Annotated[
        str | None,
        typer.Option(
            "--task-group",
            metavar="NAME",
            help="The name of its task group (several groups: corral apply -f).",
            show_default="worker",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the workload (see -o) instead of submitting it."),
    ] = False,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            metavar="yaml|json",
            help="With --dry-run: the format, YAML that `corral apply -f` takes, or JSON.",
        ),
    ] = "yaml",
) -> None:
    """Submit a workload: a command to run on GPUs, alone or as a gang of workers."""
    with reported_errors(ctx):
        command = ctx.meta.get(_COMMAND) or []
        if not command:
            raise InvalidInput("give the command to run after --, e.g. -- python train.py")
        task: dict[str, Any] = {"replicas": workers}
        if gpu is not None and gpu_memory is not None:
            raise InvalidInput("give -g/--gpu or --gpu-memory, not both")
        if gpu is not None:
            task["gpu"] = parse_gpus(gpu)
        if gpu_memory is not None:
            if parse_memory_option("--gpu-memory", gpu_memory) == 0:
                raise InvalidInput("--gpu-memory: must be more than 0")
            task["gpu_memory"] = gpu_memory
        if cpu is not None:
            task["cpu"] = parse_number("--cpu", cpu, "a number of CPUs")
        if memory is not None:
            parse_memory_option("--memory", memory)
            task["memory"] = memory
        body: dict[str, Any] = {"tasks": [task], "command": command}
        if name is not None:
            body["name"] = name
        if min_workers is not None:
            if min_workers > workers:
                raise InvalidInput(
                    f"--min-workers: {min_workers} is more than the {workers} --workers"
                )
            body["min_available"] = min_workers
        if interactive and priority is not None:
            raise InvalidInput("give --priority or --interactive, not both")
        if interactive:
            body["priority"] = "build"
        elif priority is not None:
            body["priority"] = _priority(priority)
        if preemptible is not None:
            body["preemptible"] = preemptible
        if env:
            body["env"] = dict(parse_pairs("-e/--env", env))
        if secret:
            body["secrets"] = secret_refs("--secret", secret)
        if max_runtime is not None:
            body["max_runtime"] = max_runtime
        if node_selector:
            selector: dict[str, list[str]] = {}
            for key, value in parse_pairs("--node-selector", node_selector):
                selector.setdefault(key, []).append(value)
            body["node_selector"] = selector
        if node_pool:
            body["node_pools"] = node_pool
        if topology is not None and topology_preferred is not None:
            raise InvalidInput("give --topology or --topology-preferred, not both")
        if topology is not None:
            body["topology"] = {"key": topology, "required": True}
        if topology_preferred is not None:
            body["topology"] = {"key": topology_preferred, "required": False}
        body.update(lifecycle_fields(array, after, kill_on_invalid_dep))
        if port:
            body["ports"] = [{"name": name} for name in port_names(port)]
        if task_group is not None:
            task["name"] = task_group
        body.update(travel_fields(code, requirements, python, index_url, find_links, image))
        # A task in an image has the image's environment, not this shell's.
        export = export or ("NONE" if image is not None else "ALL")
        body.update(submit_time_fields(body, export, workdir, grace_period, backoff_limit))
        given = {*body.get("env", {}), *body.get("secrets", {})}
        left_out = [n for n in secrets_left_out(export, os.environ) if n not in given]
        if dry_run:
            print_dry_run(body, project, output)
            _note_left_out(left_out)
            return
        with connect() as client:
            body["project"] = project or own_project(client, "-p/--project")
            bring_code(client, body)
            workload = client.submit(body)
    _submitted(workload)
    _note_left_out(left_out)


def _note_left_out(names: list[str]) -> None:
    """Which of the shell's variables --export ALL left out as credentials, by name only:
    a task that needs one would fail without its submitter knowing why. Said after the
    submission, so that a refused one still answers with its one error line."""
    if names:
        typer.echo(
            f"Note: --export ALL left out {', '.join(names)}: their names or values look like "
            "credentials, which a workload's env would show to whoever reads it; give them "
            "with --secret (or name them in --export).",
            err=True,
        )


def submit_time_fields(
    body: dict[str, Any],
    export: str,
    workdir: str | None,
    grace_period: str | None,
    backoff_limit: int | None,
) -> dict[str, Any]:
    """The fields that come from the submitting shell, as with sbatch: its variables
    (--export, see corral.cli.environment) and its working directory (unless --workdir
    gives one, or --code brings the directory it starts in, or it runs in an image; "."
    is the workload's own directory), and the stop and retry settings."""
    fields: dict[str, Any] = {}
    if workdir is not None:
        fields["workdir"] = workdir
    elif "code" not in body and "image" not in body:
        # With its code, a task starts in its copy of it; in an image, in its workload's
        # directory (this machine's paths are not the image's).
        fields["workdir"] = os.getcwd()
    if grace_period is not None:
        parse_duration_option("--grace-period", grace_period)
        fields["grace_period"] = grace_period
    if backoff_limit is not None:
        fields["backoff_limit"] = backoff_limit
    # -e and --secret name variables of their own, which win over the shell's.
    given = {**body.get("env", {})}
    env = {
        k: v for k, v in exported(export, os.environ).items() if k not in body.get("secrets", {})
    }
    env.update(given)
    if env:
        fields["env"] = env
    return fields


def print_dry_run(body: dict[str, Any], project: str | None, output: str) -> None:
    """The workload `corral submit` would send, as `corral apply -f` takes it."""
    if output not in ("yaml", "json"):
        raise InvalidInput(f"-o/--output: {output!r} is not yaml or json")
    document = {"name": body.pop("name")} if "name" in body else {}
    if project is not None:
        document["project"] = project
    document.update(body)
    if output == "json":
        typer.echo(json.dumps(document, indent=2))
    else:
        typer.echo(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), nl=False)


def _priority(text: str) -> str | int:
    try:
        resolve_priority(text)
    except ValueError as error:
        raise InvalidInput(f"--priority: {error}") from None
    return text if text in PRIORITY_CLASSES else int(text)


def own_project(client: Client, flag: str) -> str:
    """The logged-in member's project, for when the user gives none: their only one."""
    user = client.whoami()
    if user["project"] is None:
        raise InvalidInput(
            f"{flag}: give the project; {user['name']} ({user['role']}) has none of their own"
        )
    if len(user["projects"]) > 1:
        names = ", ".join(m["project"] for m in user["projects"])
        raise InvalidInput(f"{flag}: give the project; {user['name']} belongs to {names}")
    return user["project"]


def _submitted(workload: WorkloadOut) -> None:
    typer.echo(submitted_text(workload))


def apply_command(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Option(
            "--file",
            "-f",
            metavar="FILE",
            help="YAML with the API's workload fields; documents separated by --- "
            "are submitted in order. - reads standard input.",
            show_default=False,
        ),
    ],
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            "-p",
            help="The project of documents that name none.",
            show_default="your project",
        ),
    ] = None,
) -> None:
    """Submit the workloads described in a YAML file: all of them, or none."""
    with reported_errors(ctx):
        documents = _read_documents(file)
        with connect() as client:
            default = project
            if default is None and any("project" not in doc for doc in documents):
                default = own_project(client, "-p/--project")
            bodies = [
                read_python_field(_where(file, number, doc, len(documents)), _secrets_listed(doc))
                for number, doc in enumerate(documents, start=1)
            ]
            for number, body in enumerate(bodies, start=1):
                body.setdefault("project", default)
                where = _where(file, number, body, len(bodies))
                bring_code(client, body, f"{where}: code")
            try:
                if len(bodies) == 1:
                    workloads = [client.submit(bodies[0])]
                else:
                    workloads = client.submit_all(bodies)
            except ApiError as error:
                raise _by_document(error, file, documents) from error
            for workload in workloads:
                _submitted(workload)


def _secrets_listed(document: dict[str, Any]) -> dict[str, Any]:
    """A document whose `secrets:` is a list (`[API_KEY, DB_PASS=db-pass]`) with it as
    the API's mapping; a mapping is kept as it is."""
    listed = document.get("secrets")
    if isinstance(listed, list) and all(isinstance(item, str) for item in listed):
        return {**document, "secrets": secret_refs("secrets", listed)}
    return document


_DOCUMENT = re.compile(r"^workloads\[(\d+)\]\.?")


def _by_document(error: ApiError, file: str, documents: list[dict[str, Any]]) -> ApiError:
    """The server's error with `workloads[i].field` told as the file's document i + 1."""
    count = len(documents)
    nothing = " (nothing was submitted)" if count > 1 else ""
    if not error.problems:
        return ApiError(error.status, f"{_source(file)}: {error.message}{nothing}")
    lines = []
    for problem in error.problems:
        found = _DOCUMENT.match(problem.path)
        if found and count > 1:
            number = int(found.group(1)) + 1
            where = _where(file, number, documents[number - 1], count)
            path = problem.path[found.end() :]
        else:
            where, path = _source(file), problem.path
        lines.append(
            f"{where}: {path}: {problem.message}" if path else f"{where}: {problem.message}"
        )
    return ApiError(error.status, "; ".join(lines) + nothing, error.problems)


def _read_documents(file: str) -> list[dict[str, Any]]:
    """The file's non-empty YAML documents, each a mapping."""
    source = _source(file)
    try:
        text = read_text(sys.stdin if file == "-" else file)
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInput(f"{source}: cannot read it: {error}") from None
    except YamlLimitError as error:
        raise InvalidInput(f"{source}: {error.problem}") from None
    try:
        documents = [doc for doc in yaml.load_all(text, Loader=BoundedLoader) if doc is not None]
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InvalidInput(f"{source}: {at}{error.problem}") from None
    except yaml.YAMLError as error:
        raise InvalidInput(f"{source}: {error}") from None
    if not documents:
        raise InvalidInput(f"{source}: no workloads in it")
    for number, document in enumerate(documents, start=1):
        if not isinstance(document, dict):
            where = _where(file, number, {}, len(documents))
            raise InvalidInput(f"{where}: a workload is a mapping of fields (project, tasks, ...)")
    return documents


def _where(file: str, number: int, document: dict[str, Any], count: int) -> str:
    """ "jobs.yaml", or "jobs.yaml, document 2 (train-b)" when there are several."""
    where = _source(file)
    if count > 1:
        where += f", document {number}"
        if isinstance(document.get("name"), str):
            where += f" ({document['name']})"
    return where


def _source(file: str) -> str:
    return "<stdin>" if file == "-" else file
