"""`opgen build`: deterministic output, headers naming their inputs, `--check` catching edits."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opgen.build import freeze
from opgen.cli.main import main
from opgen.render.render import HEADER_LINES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def project(tmp_path):
    """A copy of the project's build inputs and its generated/ tree."""
    for name in ("specs", "templates", "generated"):
        shutil.copytree(ROOT / name, tmp_path / name)
    if (ROOT / "records").exists():
        shutil.copytree(ROOT / "records", tmp_path / "records")
    return tmp_path


@pytest.fixture(scope="module")
def root_build(project_build):
    """The build of the project itself, as a list of files (built once per run: conftest's
    project_build, which test_templates reads too)."""
    return project_build[0]


def test_committed_generated_tree_is_fresh(root_build):
    assert freeze.stale(ROOT, root_build) == []


def test_check_catches_a_hand_edit_and_a_stray_file_and_build_mends_both(project, root_build, capsys):
    """--check (a build of the copy, its specs loaded anew) names the edited and the stray file
    alone: the copy's build is the project's. Writing that build (what `opgen build` does after
    building; the command itself: test_console_script_builds_then_checks) mends both, writes what
    is missing and gives the bytes of the project's build."""
    table = project / "generated" / "chunk_gla_fwd_o_gk" / "table_h200.py"
    fresh = table.read_text()
    table.write_text(fresh.replace("BUDGET = ", "BUDGET = 1 + "))
    stray = project / "generated" / "chunk_gla_fwd_o_gk" / "kernels" / "npu" / "old_variant.py"
    stray.write_text("x = 1\n")
    assert main(["--root", str(project), "build", "--check"]) == 1
    err = capsys.readouterr().err  # the two files alone (the copy is fresh otherwise)
    assert "(2 files differ)" in err and "generated/chunk_gla_fwd_o_gk/table_h200.py" in err
    assert "old_variant.py" in err
    shutil.rmtree(project / "generated" / "mamba3_mimo_bwd_fwd")  # a build writes what is missing too
    missing = {f.path for f in root_build if f.path.startswith("generated/mamba3_mimo_bwd_fwd/")}
    changed = freeze.write(project, root_build)
    assert set(changed) == {"generated/chunk_gla_fwd_o_gk/table_h200.py",
                            "generated/chunk_gla_fwd_o_gk/kernels/npu/old_variant.py"} | missing
    assert not stray.exists() and table.read_text() == fresh
    built = {p.relative_to(project).as_posix(): p.read_text() for p in (project / "generated").rglob("*.py")}
    assert built == {f.path: f.text for f in root_build}
    assert freeze.stale(project, root_build) == []


def test_a_spec_change_and_a_template_change_reach_their_ops_files_alone(project, root_build):
    """One build of a copy with two edits (one build where there were two): a spec formula of
    chunk_gla_fwd_o_gk and a template of mamba3_mimo_bwd_fwd. The same paths; every file of the
    template's op differs (its templates' hash), chunk_gla's public function renders the new
    formula and `opgen build --check` would name it (freeze.stale, what --check reports; its exit
    code: test_check_catches_a_hand_edit_...), and the third op's files are unchanged."""
    spec = project / "specs" / "chunk_gla_fwd_o_gk.yaml"
    spec.write_text(spec.read_text().replace('BK: "32 if K <= 32', 'BK: "16 if K <= 32'))
    template = project / "templates" / "mamba3_mimo_bwd_fwd" / "bwd_fwd.py.j2"
    template.write_text(template.read_text() + "\n{# a comment #}\n")
    before = {f.path: f.text for f in root_build}  # the project's copy built the same files
    after = {f.path: f.text for f in freeze.build_all(project)}
    assert list(before) == list(after)
    changed = {path for path in after if after[path] != before[path]}
    assert {p for p in after if "/mamba3_mimo_bwd_fwd/" in p} <= changed
    assert not {p for p in changed if "/mamba3_mimo_bwd_bwd/" in p}
    api = "generated/chunk_gla_fwd_o_gk/__init__.py"
    assert "BK = 16 if K <= 32" in after[api] and "BK = 16 if K <= 32" not in before[api]
    assert api in freeze.stale(project, [type(root_build[0])(path, text) for path, text in after.items()])


def test_every_variant_and_chip_is_generated(root_build):
    paths = {f.path for f in root_build}
    base = "generated/chunk_gla_fwd_o_gk"
    assert f"{base}/kernels/npu/split_single_persistent.py" in paths
    assert f"{base}/kernels/cuda/fp32_h1_tiled.py" in paths
    assert f"{base}/kernels/npu/fp32_h1_tiled.py" not in paths
    for chip in ("ascend910b1", "ascend910b4", "ascend910_93", "ascend950", "h100", "h200", "interpreter"):
        assert f"{base}/table_{chip}.py" in paths


def test_generated_package_never_imports_the_driver():
    for path in (ROOT / "generated").rglob("*.py"):
        text = path.read_text()
        for banned in ("import opgen", "from opgen", "import optuna", "import jinja2", "import yaml",
                       "opgen.references"):
            assert banned not in text, (path, banned)


def test_console_script_builds_then_checks(tmp_path):
    # the small project of the tuner's tests (the project's own tree is checked in-process above)
    shutil.copytree(ROOT / "tests" / "toy_project", tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "generated", ignore_errors=True)
    for args, exit_code, said in ((["build", "--check"], 1, "generated/ is stale"), (["build"], 0, "opgen build:"),
                                  (["build", "--check"], 0, "up to date")):
        result = subprocess.run([sys.executable, "-m", "opgen.cli", "--root", str(tmp_path), *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == exit_code, result.stderr
        assert said in result.stdout + result.stderr
