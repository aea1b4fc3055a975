"""The generated ops are torch custom ops (opgen::<op>): torch.compile(fullgraph=True) traces a
model that calls them without a graph break, and its output equals the eager call's."""
import pytest
import torch

from opgen.references.chunk_gla_fwd_o_gk import make_inputs as gla_inputs
from opgen.references.mamba3_mimo_bwd_fwd import make_inputs as mamba3_inputs


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_gla_in_a_compiled_module():
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    class Model(torch.nn.Module):
        def forward(self, q, v, g, A, h):
            return chunk_gla_fwd_o_gk(q * 1.0, v, g, A, h, scale=0.5, chunk_size=32).float() + 1.0

    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=5)
    args = (x["q"], x["v"], x["g"], x["A"], x["h"])
    model = Model()
    assert torch.equal(torch.compile(model, fullgraph=True, backend="aot_eager")(*args), model(*args))
    assert hasattr(torch.ops.opgen, "chunk_gla_fwd_o_gk")


@pytest.mark.parametrize("has_z", [False, True], ids=["no_z", "z"])
def test_mamba3_with_optional_outputs_compiles(has_z):
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd

    x = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=has_z, seed=5)
    eager = mamba3_mimo_bwd_fwd(**x)
    compiled = torch.compile(lambda **kw: mamba3_mimo_bwd_fwd(**kw), fullgraph=True, backend="aot_eager")(**x)
    assert len(compiled) == 5 and (compiled[3] is None) == (not has_z) == (compiled[4] is None)
    for a, b in zip(eager, compiled):
        assert (a is None and b is None) or torch.equal(a, b)


def _graphs(graphs):
    """A torch.compile backend through AOTAutograd that keeps each forward graph it compiles (and
    runs it as it is, as aot_eager does)."""
    from torch._dynamo.backends.common import aot_autograd

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm
    return aot_autograd(fw_compiler=keep)


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_gla_under_the_interpreter_is_one_graph_around_the_opaque_op():
    """Interpreted kernels cannot be traced (torch.library.wrap_triton returns an interpreted
    kernel as it is, and it would run on the tracer's fake tensors): the graph holds the opaque
    op, and nothing breaks it."""
    import generated.chunk_gla_fwd_o_gk as module
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=6)
    fn = lambda **kw: module.chunk_gla_fwd_o_gk(**kw) * 2  # noqa: E731
    counter = CompileCounterWithBackend("aot_eager")
    assert torch.equal(torch.compile(fn, backend=counter, fullgraph=True)(**x), fn(**x))
    assert counter.frame_count == 1
    graphs = []
    torch.compile(lambda **kw: module.chunk_gla_fwd_o_gk(**kw) * 2, backend=_graphs(graphs), fullgraph=True)(**x)
    assert "opgen.chunk_gla_fwd_o_gk_opaque.default" in _targets(graphs[0])


@pytest.mark.skipif(not hasattr(torch.library, "triton_op"), reason="torch.library.triton_op is torch >= 2.6")
def test_gla_kernels_are_nodes_of_the_compiled_graph(monkeypatch):
    """Where torch can trace the launches (Triton JIT kernels on an NVIDIA GPU), the compiled graph
    holds the GLA kernel itself, and its output is the eager call's. On this CPU host: the kernel
    module's traced twin imported without the interpreter (JIT kernels), the CPU tensors' table
    taken as traceable, and the graph's launch of the JIT kernel run by the interpreted kernel
    of the same name (the eager call's), since no Triton driver runs a JIT kernel here."""
    import sys

    import generated.chunk_gla_fwd_o_gk as module
    from triton.runtime.jit import JITFunction

    torch._dynamo.reset()
    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=7)
    fn = lambda **kw: module.chunk_gla_fwd_o_gk(**kw) * 2  # noqa: E731
    eager = fn(**x)  # interpreted; caches the CPU tensors' table

    def interpreted(self, *args, grid, warmup, **kwargs):
        return getattr(sys.modules[self.fn.__module__], self.fn.__name__)[grid](*args, **kwargs)
    monkeypatch.setattr(module, "_traceable", lambda table, variant: True)
    monkeypatch.setattr(module, "_TWINS", {})
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the twin's kernels: JIT, as on a GPU
    monkeypatch.setattr(JITFunction, "run", interpreted)
    graphs = []
    compiled = torch.compile(fn, backend=_graphs(graphs), fullgraph=True)
    assert torch.equal(compiled(**x), eager)
    (graph,) = graphs
    assert "opgen.chunk_gla_fwd_o_gk_opaque.default" not in _targets(graph)
    (launch,) = [n for n in graph.graph.nodes if "triton_kernel_wrapper_functional" in str(n.target)]
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kernel = kernel_side_table.get_kernel(launch.kwargs["kernel_idx"])
    assert isinstance(kernel, JITFunction) and kernel.fn.__name__ == "chunk_gla_fwd_o_gk_kernel"
    (twin,) = module._TWINS.values()
    assert twin.KERNEL is twin.chunk_gla_fwd_o_gk_kernel and isinstance(twin.KERNEL, JITFunction)  # unwrapped after
    torch._dynamo.reset()


@pytest.mark.skipif(not hasattr(torch.library, "triton_op"), reason="torch.library.triton_op is torch >= 2.6")
def test_gla_strided_views_reach_the_traced_kernel_without_a_copy(monkeypatch):
    """Strided views (q and v slices of one fused projection, g transposed) traced as in the test
    above: the graph launches the strided twin's kernel on the graph's inputs themselves, with
    their strides, and holds no copy of them; its output is the eager call's."""
    import sys

    import generated.chunk_gla_fwd_o_gk as module
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from triton.runtime.jit import JITFunction

    torch._dynamo.reset()
    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=7)
    fused = torch.cat([x["q"], x["v"]], dim=-1)
    views = {**x, "q": fused[..., :32], "v": fused[..., 32:], "g": x["g"].transpose(1, 2).contiguous().transpose(1, 2)}
    fn = lambda **kw: module.chunk_gla_fwd_o_gk(**kw) * 2  # noqa: E731
    eager = fn(**views)

    def interpreted(self, *args, grid, warmup, **kwargs):
        return getattr(sys.modules[self.fn.__module__], self.fn.__name__)[grid](*args, **kwargs)
    monkeypatch.setattr(module, "_traceable", lambda table, variant: True)
    monkeypatch.setattr(module, "_TWINS", {})
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(JITFunction, "run", interpreted)
    graphs = []
    assert torch.equal(torch.compile(fn, backend=_graphs(graphs), fullgraph=True)(**views), eager)
    (graph,) = graphs
    targets = _targets(graph)
    assert not any("clone" in t or "contiguous" in t or "copy" in t for t in targets), targets
    (launch,) = [n for n in graph.graph.nodes if "triton_kernel_wrapper_functional" in str(n.target)]
    kernel = kernel_side_table.get_kernel(launch.kwargs["kernel_idx"])
    assert kernel.fn.__module__.startswith("generated.chunk_gla_fwd_o_gk.kernels.npu.strided.")
    args = {**kernel_side_table.get_constant_args(launch.kwargs["constant_args_idx"]), **launch.kwargs["kwargs"]}
    assert args["stride_q_t"] == args["stride_v_t"] == 2 * 64 and args["stride_g_h"] == 40 * 32
    # the inputs themselves: g, and q and v views of the fused tensor, which the graph takes whole
    assert args["g"].op == "placeholder"
    assert all(str(args[n].target) == "aten.as_strided.default" for n in ("q", "v")), [args[n].target for n in "qv"]
    ((_, _, strided),) = module._TWINS
    assert strided
    torch._dynamo.reset()


def _first_line(fn, *args, fullgraph=True, **kwargs):
    """The exception ``fn`` raises compiled (backend eager), and the first line of its message."""
    torch._dynamo.reset()
    with pytest.raises(Exception) as caught:
        torch.compile(fn, backend="eager", fullgraph=fullgraph)(*args, **kwargs)
    return caught.value, str(caught.value).splitlines()[0]


def _gla_args():
    x = gla_inputs(1, 40, 2, 32, 32, 32, dtype=torch.float16, seed=5)
    return x["q"], x["v"], x["g"], x["A"], x["h"]


@pytest.mark.parametrize("change, kind, first", [
    ({"chunk_size": 48}, ValueError, "chunk_gla_fwd_o_gk: chunk_size must be one of 32, 64, got 48"),
    ({"v": lambda v: v.float()}, TypeError, "chunk_gla_fwd_o_gk: v.dtype must be one of float16, bfloat16, got "
                                            "torch.float32"),
    ({"h": lambda h: h[:, :, :1]}, ValueError, "chunk_gla_fwd_o_gk: h.shape[2] must be H = 2 (from q.shape[2]), "
                                               "got 1"),
], ids=["value", "dtype", "shape"])
def test_a_compiled_call_the_op_refuses_leads_with_the_ops_own_message(change, kind, first):
    """Under torch.compile(fullgraph=True) the error is the op's own, of its own kind, its message
    the first line (Dynamo would otherwise lead with "RuntimeError when making fake tensor call");
    without fullgraph the graph breaks there and the eager call raises it."""
    from generated.chunk_gla_fwd_o_gk import chunk_gla_fwd_o_gk

    args = dict(zip("q v g A h".split(), _gla_args()), scale=0.5, chunk_size=32)
    args.update({k: v(args[k]) if callable(v) else v for k, v in change.items()})
    tensors = [args.pop(n) for n in "q v g A h".split()]
    for fullgraph in (True, False):
        exc, line = _first_line(lambda *t: chunk_gla_fwd_o_gk(*t, **args).float() + 1.0, *tensors,
                                fullgraph=fullgraph)
        assert isinstance(exc, kind) and line == first, (fullgraph, type(exc), str(exc))


def test_the_mamba3_stage_and_the_composed_backward_lead_with_their_own_message():
    from composed import mamba3_mimo_backward
    from generated.mamba3_mimo_bwd_fwd import mamba3_mimo_bwd_fwd
    from opgen.references.mamba3_mimo_forward import INPUTS, make_inputs

    x = mamba3_inputs(1, 16, 2, 1, 8, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=True, seed=5)
    exc, line = _first_line(lambda **kw: mamba3_mimo_bwd_fwd(**{**kw, "z": None}), **x)
    assert isinstance(exc, ValueError)
    assert line == "mamba3_mimo_bwd_fwd: mimo_z and z must be given together (the Z gate needs both), got mimo_z " \
                   "True and z False"
    x = make_inputs(1, 10, 2, 1, 16, 8, 1, chunk_size=8, dtype=torch.float32, has_z=False, has_d=False, seed=4)
    x = {n: t.float() if isinstance(t, torch.Tensor) else t for n, t in x.items()}  # its parameters are float64
    tensors = [x["dout"]] + [x[n] if n != "dt" else x[n][0] for n in INPUTS]
    exc, line = _first_line(lambda *t: mamba3_mimo_backward(*t, chunk_size=8), *tensors)
    assert isinstance(exc, ValueError) and line == "mamba3_mimo_backward: dt must have 3 dims [B, H, S], got shape " \
                                                   "(2, 10)"
    tensors[1 + INPUTS.index("dt")] = x["dt"]
    tensors[1 + INPUTS.index("k")] = x["k"][..., :-2]  # a stage's own check, through the composed op
    exc, line = _first_line(lambda *t: mamba3_mimo_backward(*t, chunk_size=8), *tensors)
    assert isinstance(exc, ValueError) and line.startswith("mamba3_mimo_bwd_fwd: k.shape[4] must be N = 16"), line


def test_the_composed_backward_is_one_graph_and_its_autograd_path_compiles():
    """The whole Mamba-3 backward (both stages and the reductions) traces with fullgraph and no
    graph break, its gradients equal to the eager call's; a loss through the autograd path
    (reference forward, opgen's backward) compiles, and its gradients are the eager ones."""
    import functools

    from composed import mamba3_mimo_backward, with_opgen_backward
    from opgen.references.mamba3_mimo_forward import INPUTS, forward, make_inputs

    x = make_inputs(1, 10, 2, 1, 16, 8, 2, chunk_size=8, dtype=torch.bfloat16, has_z=True, has_d=True, seed=4)
    x = {n: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t for n, t in x.items()}
    tensors = [x["dout"]] + [x[n] for n in INPUTS]
    call = lambda *t: mamba3_mimo_backward(*t, chunk_size=8)  # noqa: E731
    eager = call(*tensors)
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(*tensors)
    assert all((a is None) == (b is None) and (a is None or torch.equal(a, b)) for a, b in zip(eager, compiled))
    assert torch._dynamo.explain(call)(*tensors).graph_break_count == 0
    leaves = [t.clone().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in (x[n] for n in INPUTS)]
    layer = with_opgen_backward(functools.partial(forward, chunk_size=8), chunk_size=8)

    def loss(*inputs):
        return (layer(*inputs).float() * x["dout"].float()).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        for t in leaves:
            if isinstance(t, torch.Tensor):
                t.grad = None
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves if isinstance(t, torch.Tensor)])
    assert all(g is not None and g.abs().max() > 0 for g in grads[1])
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*grads))
