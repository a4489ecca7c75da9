"""Shared fixtures: a real `corral server` process, on SQLite or on a real PostgreSQL.

`live_server` starts the console script on an ephemeral port with its own data directory
and waits for /healthz; `backend` is parametrised over "sqlite" and "postgresql". Tests
that need PostgreSQL skip when pgserver cannot start one, except under CI=true, where
they fail instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.store import Store

CORRAL = str(Path(sys.executable).with_name("corral"))
IN_CI = os.environ.get("CI", "").lower() == "true"


# The backends a module's servers are parametrised by: a module's tests for one backend
# share that backend's server, and may run on another worker than the other backends'.
BACKENDS = frozenset({"sqlite", "postgresql", "agent"})


# Every test is in one tier, the heaviest of what it uses (lightest first here): `make
# check` runs unit and server, `make test` all of them. The fixtures a test uses and its
# parameters say some (TIER_OF_FIXTURE; a test on PostgreSQL is a postgres test); for the
# rest the most specific entry that names it does: its own in TIER_OF_TEST, else in
# TIER_OF_PATH its module's with one of its parameters ("module[value]"), its module's or
# its directory's. A test that none of these classify fails collection until it is given
# a tier here.
TIERS = {
    "unit": "no server, database or corral process: engine, model, sim, scenario, pure functions",
    "server": "an application or a store in the test's process, on SQLite",
    "process": "real corral processes (servers, agents and their tasks, the CLI), Unix "
    "accounts, cgroups",
    "postgres": "PostgreSQL (a test on both databases is in this tier on PostgreSQL)",
    "chaos": "tests/chaos: corral up killed at random",
    "ray": "tests/ray: Ray clusters",
    "browser": "Chromium: tests/dashboard, and the browser tests elsewhere",
}
TIER_OF_FIXTURE = {
    "store": "server",
    # Real corral processes: `root_conftest` is how the fixtures of tests/server and
    # tests/cli start this module's servers, `corral` is tests/workspaces' `corral up`.
    "live_server": "process",
    "shared_server": "process",
    "start_server": "process",
    "root_conftest": "process",
    "corral_up": "process",
    "module_corral_up": "process",
    "unix_accounts": "process",
    "corral": "process",
    "postgres": "postgres",
    "browser": "browser",
}
# A process here is corral's: its console script, its agent's task, or a Python child that
# imports corral.
TIER_OF_PATH = {
    "tests/chaos": "chaos",
    "tests/ray": "ray",
    "tests/dashboard": "browser",
    "tests/unit": "unit",
    "tests/property": "unit",
    "tests/sim": "unit",
    "tests/test_plan_fuzz.py": "unit",
    "tests/test_pools.py": "unit",
    "tests/test_scenario_loader.py": "unit",
    "tests/test_scenarios.py": "unit",
    "tests/test_yaml_bounds.py": "unit",
    # Agents with their task processes, exec sessions, cgroups, nftables, Unix accounts.
    "tests/agent": "process",
    "tests/agent/test_agent_sdk_units.py": "unit",
    "tests/agent/test_checkpoint_units.py": "unit",
    "tests/agent/test_log_shipping.py": "unit",
    "tests/agent/test_logcap_units.py": "unit",
    # `corral` commands in subprocesses.
    "tests/cli": "process",
    "tests/cli/test_port_forward_spec.py": "unit",
    "tests/sim/test_sim_cli.py": "process",
    "tests/test_plan_cli.py": "process",
    # Stores of an older schema, on SQLite.
    "tests/unit/test_checkpoint_store.py": "server",
    "tests/unit/test_life_migration.py": "server",
    "tests/unit/test_memberships_migration.py": "server",
    "tests/unit/test_past_migration.py": "server",
    "tests/unit/test_pending_since_migration.py": "server",
    "tests/unit/test_pools_store.py": "server",
    "tests/unit/test_queue_usage_store.py": "server",
    "tests/unit/test_reservation_store.py": "server",
    "tests/unit/test_sched_migration.py": "server",
    "tests/server/test_unix_user_migration.py": "server",
    # tests/server: the live servers' tests are told by their fixtures.
    "tests/server/test_admission.py": "unit",
    "tests/server/test_decision_log.py": "unit",
    "tests/server/test_outputs.py": "unit",
    "tests/server/test_scope.py": "unit",
    "tests/server/test_routes.py": "server",
    "tests/server/test_sdk_types.py": "server",
    "tests/server/test_store_processes.py": "process",
    "tests/server/test_watch.py[child]": "process",
    "tests/server/test_worker_threads.py": "server",
    "tests/visibility/test_visibility_live.py": "process",
    "tests/visibility/test_visibility_sampling.py": "unit",
    "tests/visibility/test_visibility_store.py": "unit",
    # `corral up` with workspaces, exec sessions' processes.
    "tests/workspaces": "process",
    "tests/workspaces/test_workspace_store.py": "server",
}
# Single tests that their module's entry in TIER_OF_PATH does not tell.
TIER_OF_TEST = {
    "tests/agent/test_agent_orders.py": {
        "test_what_the_store_releases_carries_the_time_before_the_release": "server",
    },
    "tests/agent/test_agent_planted.py": {
        "test_a_planted_secret_key_link_is_not_read": "unit",
        "test_a_private_file_is_made_0600_and_an_own_one_rewritten": "unit",
        "test_an_unplanted_path_under_a_shared_directory_is_made_and_taken": "unit",
    },
    "tests/agent/test_agent_sdk_units.py": {
        "test_a_writer_killed_mid_save_never_leaves_a_torn_checkpoint": "process",
        "test_install_turns_a_real_sigterm_into_requested": "process",
        "test_without_install_sigterm_kills_as_usual": "process",
    },
    "tests/agent/test_cgroups_units.py": {
        "test_find_takes_a_v2_tree_that_has_the_controllers": "unit",
        "test_find_takes_v1_controllers_where_each_is_mounted": "unit",
        "test_v2_hands_the_controllers_down_and_writes_the_limits": "unit",
        "test_v2_reads_an_oom_kill_and_the_limit_as_people_write_it": "unit",
    },
    "tests/agent/test_checkpoint_units.py": {
        "test_the_ray_node_agent_drains_checkpoint_times": "process",
    },
    "tests/agent/test_log_shipping.py": {
        "test_an_answer_the_server_did_not_acknowledge_is_sent_again": "process",
    },
    "tests/agent/test_logs_and_demo.py": {
        "test_render_keeps_only_the_last_state_of_a_progress_bar": "unit",
    },
    "tests/cli/test_port_forward_spec.py": {
        "test_the_command_refuses_a_bad_spec_before_reaching_the_server": "process",
    },
    "tests/server/test_sdk_types.py": {
        "test_the_sdk_imports_no_server_code": "process",
    },
    "tests/server/test_watch.py": {
        "test_a_task_end_taken_in_wakes_a_request_waiting_for_the_end": "process",
    },
    "tests/server/test_worker_threads.py": {
        "test_a_command_that_starts_a_server_refuses_a_bad_worker_threads_setting": "process",
    },
    "tests/test_plan_cli.py": {
        "test_an_internal_error_is_one_line_and_exit_3": "unit",
    },
    "tests/test_yaml_bounds.py": {
        "test_plan_exits_2_with_one_line_naming_the_file_in_little_memory": "process",
        "test_apply_and_simulate_exit_2_with_one_line_naming_the_file": "process",
    },
    "tests/unit/test_lazy_imports.py": {
        "test_the_cli_starts_without_the_engine_or_numpy": "process",
    },
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: a module that takes minutes; it is started before the others"
    )
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: test tier: {what}")


def tier_of(item: pytest.Item) -> str | None:
    """The heaviest of what the item's fixtures and parameters, TIER_OF_PATH and TIER_OF_TEST
    say."""
    path = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    values = list(callspec.params.values()) if callspec else []
    found = [TIER_OF_FIXTURE[name] for name in item.fixturenames if name in TIER_OF_FIXTURE]
    if "postgresql" in values:
        found.append("postgres")
    # Most specific last: the directories down to the module, the module with one of the
    # test's parameters, the test.
    parts = path.split("/")
    keys = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    keys += [f"{path}[{value}]" for value in values if isinstance(value, str)]
    named = [TIER_OF_PATH[key] for key in keys if key in TIER_OF_PATH]
    own = TIER_OF_TEST.get(path, {}).get(getattr(item, "originalname", item.name))
    named += [own] if own else []
    found += named[-1:]
    order = list(TIERS)
    return max(found, key=order.index) if found else None


def mark_tiers(items: list[pytest.Item]) -> None:
    """Mark each item with its tier; fail collection on an item with none or with two (a
    marker of its own that differs from what tier_of says)."""
    wrong = []
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(sorted(tiers)) or 'no tier'}")
    if wrong:
        raise pytest.UsageError(
            "each test needs exactly one tier (tests/conftest.py: TIER_OF_PATH, TIER_OF_TEST):\n"
            + "\n".join(wrong)
        )


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """Mark each test with its tier before `-m` selects by them; then, after pytest's own
    reordering by fixture parameters, long modules first (a stable sort keeps each
    module's order): run in parallel, they would otherwise be left to the end, each on one
    worker while the others idle."""
    mark_tiers(items)
    yield
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist hands out one module's tests for one backend at a time (a module
    whose servers are module fixtures starts each once, as `--dist loadfile` would),
    so that the halves of a module run on two backends side by side."""
    from xdist.scheduler import LoadScopeScheduling

    class BackendScopes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            params = nodeid.rsplit("[", 1)[1].rstrip("]").split("-") if "[" in nodeid else []
            backend = next((param for param in params if param in BACKENDS), None)
            return f"{module}[{backend}]" if backend else module

    # In collection order (long modules first), not xdist's default of the scopes with
    # the most tests first, which hands out the fuzzer's two long tests last.
    config.option.loadscopereorder = False
    return BackendScopes(config, log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LiveServer:
    """A running `corral server` and what a client needs to talk to it."""

    url: str
    data_dir: Path
    db: str | None
    token: str
    process: subprocess.Popen[bytes]
    log: Path
    extra_args: list[str] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return httpx.Client(base_url=self.api, headers=headers, timeout=30)

    def kill(self) -> None:
        """kill -9: no chance to clean up."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stop the server; fail if its scheduler caught a kept snapshot that differed
        from the store, or kept engine state that decided otherwise than a fresh cycle
        (when CORRAL_VERIFY_SNAPSHOTS is set: tests/agent/test_verified_snapshots.py)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log.exists():
            mismatches = [
                line
                for line in self.log.read_text().splitlines()
                if "kept snapshot" in line or "kept state" in line
            ]
            assert not mismatches, f"{self.log}: " + "\n".join(mismatches[:5])

    def restart(self) -> None:
        """Start the server again on the same port, data directory and database."""
        self.stop()
        started = start_server(self.data_dir, self.db, port=int(self.url.rsplit(":", 1)[1]))
        self.process = started.process
        self.log = started.log


def start_server(data_dir: Path, db: str | None, port: int | None = None) -> LiveServer:
    port = port or free_port()
    log = data_dir / f"server-{port}.log"
    args = [CORRAL, "server", "--data-dir", str(data_dir), "--port", str(port)]
    if db:
        args += ["--db", db]
    with open(log, "ab") as handle:
        process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"corral server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"corral server did not start: {log.read_text()}")
        time.sleep(0.1)
    token = (data_dir / "admin-token").read_text().strip()
    return LiveServer(url, data_dir, db, token, process, log)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Callable[[], str]]:
    """A factory of fresh PostgreSQL databases on one real server started by pgserver."""
    try:
        import pgserver
    except ImportError as error:  # pragma: no cover - pgserver is a dev dependency
        if IN_CI:
            raise
        pytest.skip(f"pgserver is not installed: {error}")
    root = tempfile.mkdtemp(prefix="corral-pg-")
    try:
        server = pgserver.get_server(root, cleanup_mode="delete")
    except Exception as error:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL could not start: {error}")
    uri = server.get_uri()
    counter = 0

    def fresh() -> str:
        nonlocal counter
        counter += 1
        name = f"corral_{os.getpid()}_{counter}"
        server.psql(f"CREATE DATABASE {name};")
        return uri.replace("/postgres?", f"/{name}?")

    yield fresh
    server.cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty, migrated store, in this process, on each backend."""
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres")()
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    else:
        url = f"sqlite:///{tmp_path / 'corral.db'}"
    opened = Store(url)
    yield opened
    opened.close()


@pytest.fixture
def live_server(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[LiveServer]:
    """A real server process with an empty store on the `backend` database."""
    db = request.getfixturevalue("postgres")() if backend == "postgresql" else None
    server = start_server(tmp_path, db)
    yield server
    server.stop()


def json_of(response: httpx.Response) -> Any:
    assert response.headers["content-type"].startswith("application/json"), response.text
    return response.json()
