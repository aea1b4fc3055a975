"""pytest set-up: the Triton interpreter for every kernel launch, with bf16 by value.

TRITON_INTERPRET must be set before any kernel module is imported (``triton.jit`` reads it at
decoration time); ``opgen.evidence.frontend`` must be imported before the first interpreted launch so it
can snapshot the pristine ``triton.language`` it compiles with.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import opgen.evidence.frontend  # noqa: E402,F401  (see the module docstring)
from opgen.run.interpreter import patch_bf16  # noqa: E402

patch_bf16()


# --- PostgreSQL: a real server for the tests of campaigns shared by hosts ----------------------
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

POSTGRES_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres_server.sh"
POSTGRES_URL_ENV = "OPGEN_TEST_POSTGRES_URL"  # set by .ci/run, which starts the server


class PostgresServer:
    """A throwaway PostgreSQL server in a scratch folder (``scripts/postgres_server.sh``)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="opgen-pg-"))  # under /tmp: the server's user reaches it
        self.url = self._script("start")

    def _script(self, command: str) -> str:
        result = subprocess.run(["bash", str(POSTGRES_SCRIPT), command, str(self.dir)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            pytest.fail(f"PostgreSQL server: `{POSTGRES_SCRIPT.name} {command}` failed: {result.stderr.strip()}; "
                        f"these tests need PostgreSQL's server binaries (or {POSTGRES_URL_ENV} naming a server)",
                        pytrace=False)
        return result.stdout.strip()

    def restart(self) -> None:
        self._script("restart")

    def stop(self) -> None:
        try:
            self._script("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _admin(server_url: str, statement: str) -> None:
    """Run ``statement`` outside a transaction on the server of ``server_url``."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(statement))
    finally:
        engine.dispose()


def fresh_database(server_url: str) -> str:
    """A new, empty database on the server of ``server_url``; its URL."""
    import sqlalchemy

    name = f"opgen_test_{uuid.uuid4().hex[:12]}"
    _admin(server_url, f"CREATE DATABASE {name}")
    return sqlalchemy.engine.make_url(server_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="package")
def postgres_server():
    """The URL of a PostgreSQL server: CI's (``OPGEN_TEST_POSTGRES_URL``), else one started here
    for the whole test run; a missing server fails the tests that need it, never skips them."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        yield url
        return
    server = PostgresServer()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh database for one test, dropped after it."""
    import sqlalchemy

    url = fresh_database(postgres_server)
    yield url
    _admin(postgres_server, f"DROP DATABASE IF EXISTS {sqlalchemy.engine.make_url(url).database} WITH (FORCE)")


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own (one it may restart)."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


# --- the build of the project itself, once per test run ------------------------------------------
@pytest.fixture(scope="session")
def project_build(tmp_path_factory, worker_id):
    """``freeze.build_all`` of the repository, and the context names each template was rendered
    with (template name -> set of names): built once for the whole run, the xdist workers sharing
    it through a file (the first to ask builds, the others wait for it and read it)."""
    import json

    from filelock import FileLock

    from opgen.build import freeze
    from opgen.render import kernels
    from opgen.render.kernels import GeneratedFile

    def build():
        seen: dict[str, set[str]] = {}
        real = freeze.render

        def spy(env, template, context, *width):
            seen.setdefault(template, set()).update(context)
            return real(env, template, context, *width)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(freeze, "render", spy)
            mp.setattr(kernels, "render", spy)
            files = freeze.build_all(Path(__file__).resolve().parents[1])
        return {"files": [[f.path, f.text] for f in files], "passed": {t: sorted(n) for t, n in seen.items()}}

    if worker_id == "master":
        data = build()
    else:
        shared = tmp_path_factory.getbasetemp().parent / "project_build.json"
        with FileLock(str(shared) + ".lock"):
            if shared.is_file():
                data = json.loads(shared.read_text(encoding="utf-8"))
            else:
                data = build()
                shared.write_text(json.dumps(data), encoding="utf-8")
    return ([GeneratedFile(path, text) for path, text in data["files"]],
            {t: set(names) for t, names in data["passed"].items()})


@pytest.fixture(scope="session")
def h200_table():
    """``h200_table(op)``: (spec, frozen_rows of the op's committed H200 records), computed once a
    test process (several tests read the same committed table; none changes it)."""
    from opgen.render.kernels import kernel_hashes
    from opgen.spec.hardware import profile
    from opgen.spec.spec import load_spec
    from opgen.storage.records import record_path
    from opgen.table.table import frozen_rows

    root, chip, cache = Path(__file__).resolve().parents[1], profile("h200"), {}

    def get(op: str):
        if op not in cache:
            spec = load_spec(root / "specs" / f"{op}.yaml", root)
            cache[op] = spec, frozen_rows(spec, chip, record_path(root, chip.name, op),
                                          kernel_hashes(root, spec, chip.rendering))
        return cache[op]
    return get
