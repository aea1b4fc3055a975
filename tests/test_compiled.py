"""The compiled kernels a launch ran, and the on-chip usage the tuner records from them."""
from types import SimpleNamespace

from triton.runtime.jit import JITFunction

from opgen.run.compiled import kept_kernels, reported


def _kernel(shared: int, regs: int, spills: int) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(shared=shared), n_regs=regs, n_spills=spills)


def test_a_launch_of_several_kernels_reports_the_largest_figures():
    figures = reported([_kernel(1024, 96, 0), _kernel(40960, 255, 292), _kernel(2048, 64, 0)])
    assert figures == {"shared": 40960, "n_regs": 255, "n_spills": 292}


def test_what_the_compiler_does_not_report_is_left_out():
    assert reported([SimpleNamespace(metadata=None), None]) == {}
    assert reported([SimpleNamespace(metadata=SimpleNamespace(shared=512), n_regs="?")]) == {"shared": 512}


def test_every_jit_launch_is_kept_and_run_is_restored(monkeypatch):
    calls = []

    def run(self, *args, **kwargs):
        calls.append((self, args, kwargs))
        return f"compiled {len(calls)}"

    monkeypatch.setattr(JITFunction, "run", run)
    with kept_kernels() as kept:
        assert JITFunction.run("k1", 1, grid=(1,), warmup=False) == "compiled 1"
        assert JITFunction.run("k2", 2, grid=(2,), warmup=False) == "compiled 2"
    assert kept == ["compiled 1", "compiled 2"]
    assert JITFunction.run is run
    assert [c[0] for c in calls] == ["k1", "k2"]
