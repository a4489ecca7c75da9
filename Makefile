# The two entry points of the README. Each creates .venv when it is missing and installs
# the project with its dev extras (again whenever pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check lint typecheck suite fast bench sdk-types clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# `make run PORT=8800 GPUS=8 DATA=$HOME/corral-8800` or `make run ARGS='--label rack=r1'`:
# each is passed to `corral up` only when given (its defaults otherwise).
RUN_ARGS := $(if $(PORT),--port $(PORT)) $(if $(GPUS),--virtual-gpus $(GPUS)) \
	$(if $(DATA),--data-dir $(DATA)) $(ARGS)

run: $(STAMP)
	$(BIN)/corral up $(RUN_ARGS)

# The type check runs beside the tests, its output printed after theirs: it takes 45 s of
# one core, and while the tests keep both cores busy it costs them about half of that.
# `make test` runs every tier (`suite`), `make check` the fast ones (`fast`).
TYPECHECK_LOG := .typecheck.log
test: TESTS := suite
check: TESTS := fast
test check: lint
	@$(MAKE) --no-print-directory typecheck >$(TYPECHECK_LOG) 2>&1 & check=$$!; \
	$(MAKE) --no-print-directory $(TESTS); status=$$?; \
	wait $$check; check_status=$$?; \
	echo "--- typecheck (exit $$check_status)"; cat $(TYPECHECK_LOG); rm -f $(TYPECHECK_LOG); \
	test $$status = 0 && test $$check_status = 0

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# The Ray tests start Ray clusters, which move the test process into a process group of
# its own: they run in a pytest of their own that `timeout` kills directly, beside the
# rest and ahead of it for the CPU (the rest runs under nice): they mostly wait on Ray,
# and the rest fills the cores meanwhile. The rest runs on five workers (pytest-xdist),
# one module's tests for one backend on one worker (tests/conftest.py): most tests wait
# on servers, agents and browsers (two workers left a third of the two cores idle, and
# four with the Ray tests beside them a fifth).
# The sources are compiled first: the tests start hundreds of corral processes (servers,
# their schedulers, agents, CLI commands), and where PYTHONDONTWRITEBYTECODE is set (CI)
# each of them compiled every module it imported again (0.3-0.5 s of CPU per server).
RAY_LOG := .ray-tests.log
suite: $(STAMP)
	@$(BIN)/python -m compileall -q src
	@command -v chromium >/dev/null 2>&1 || echo "note: chromium is missing, so the" \
		"dashboard tests are skipped (install it: sudo apt-get install chromium)"
	@timeout -s KILL 900 $(BIN)/pytest -q tests/ray >$(RAY_LOG) 2>&1 & ray=$$!; \
	nice -n 10 $(BIN)/pytest -q -n 5 --ignore=tests/ray; status=$$?; \
	wait $$ray; ray_status=$$?; \
	echo "--- tests/ray (exit $$ray_status)"; cat $(RAY_LOG); rm -f $(RAY_LOG); \
	test $$status = 0 && test $$ray_status = 0

# The tiers of tests that start no corral process, database server, browser or Ray
# (tests/conftest.py): they keep the cores busy themselves, so one worker a core.
fast: $(STAMP)
	$(BIN)/pytest -q -n 2 -m "unit or server"

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_scale.py

# corral.sdk.types is generated from the API; `make test` and `make check` fail when it is out of date.
sdk-types: $(STAMP)
	$(BIN)/python -m corral.server.typegen

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis $(RAY_LOG) $(TYPECHECK_LOG)
