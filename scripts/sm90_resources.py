"""Compile a generated mamba3_mimo_bwd_fwd variant's kernels for an NVIDIA target without a GPU and
print each kernel's registers, spill bytes, stack and shared memory, as ptxas reports them (and,
with --sass, its SASS instruction mix).

    python scripts/sm90_resources.py [--variant splitscan_static_separate] [--arch 90]
        [--case N128_P64_R4_C16[_Z] ...] [--set BLOCK_P=64 BLOCK_N=32 num_warps=4 ...]
        [--kernels chunk gate] [--sass DIR]

Needs a Triton with its NVIDIA backend (3.6: ``pip install triton==3.6.0`` beside a CPU torch);
the launches are built by the variant's ``kernel_calls`` on small CPU tensors of the case's shape,
compiled by Triton's own binder and compiler (as a launch would, minus the launch) through a driver
that names the target, and the PTX is assembled again with ``ptxas -v`` for the figures. What a
kernel costs in registers decides its occupancy and spills; this reads it in seconds, on any host.
"""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
OP = "mamba3_mimo_bwd_fwd"


class _TargetDriver:
    """The least of a Triton driver that lets the JIT compile for ``target`` without a device."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


def compile_for(cc: str) -> tuple[str, str]:
    """Make Triton's JIT compile for NVIDIA compute capability ``cc`` (``"90"``) with no device:
    the path of the ptxas Triton ships and the arch name it assembles for (``90a``).

    Raises:
        SystemExit: this Triton has no NVIDIA backend.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    if "nvidia" not in __import__("triton.backends", fromlist=["backends"]).backends:
        raise SystemExit("this Triton has no NVIDIA backend (install triton with it, e.g. triton==3.6.0)")
    driver.set_active(_TargetDriver(GPUTarget("cuda", int(cc), 32)))
    ptxas = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")
    return ptxas, cc + ("a" if cc == "90" else "")


def value(text: str):
    """A --set value: int, bool or string."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def ptxas_usage(ptx: str, arch: str, ptxas: str) -> dict:
    """registers, spill stores/loads (bytes) and static shared memory from ``ptxas -v``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}", str(src), "-o", str(Path(tmp) / "k.o")],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    stack = re.search(r"(\d+) bytes stack frame", out)
    return dict(regs=int(regs.group(1)) if regs else None, stack=int(stack.group(1)) if stack else None,
                spill_stores=int(spill.group(1)) if spill else None,
                spill_loads=int(spill.group(2)) if spill else None)


# SASS opcode classes counted by --sass (static counts: an instruction in a loop counts once)
_CLASSES = {"mma": ("HMMA", "HGMMA", "IMMA"), "shared": ("LDS", "STS", "LDSM", "STSM"), "global": ("LDG", "STG"),
            "local": ("LDL", "STL"), "barrier": ("BAR",), "fp32": ("FFMA", "FMUL", "FADD", "FMNMX"),
            "mufu": ("MUFU",), "shuffle": ("SHFL",)}


def sass_mix(cubin: bytes, out: Path) -> str:
    """Disassemble ``cubin`` to ``out`` and count its instructions by class."""
    out.parent.mkdir(parents=True, exist_ok=True)
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    binary = out.with_suffix(".cubin")
    binary.write_bytes(cubin)
    text = subprocess.run([str(cuobjdump), "-sass", str(binary)], capture_output=True, text=True, check=True).stdout
    out.write_text(text)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", text)
    counts = {k: sum(op in v for op in ops) for k, v in _CLASSES.items()}
    return f"{len(ops)} instructions: " + " ".join(f"{k} {n}" for k, n in counts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="splitscan_static_separate")
    parser.add_argument("--arch", default="90", help="compute capability (90: H100 / H200)")
    parser.add_argument("--case", nargs="+", default=["N128_P64_R4_C16"])
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                        help="point entries over the spec's default (tunables and num_warps / num_stages)")
    parser.add_argument("--kernels", nargs="*", default=None, help="only these kernels (chunk, state, ...)")
    parser.add_argument("--sass", metavar="DIR", help="write each kernel's SASS there and print its instruction mix")
    args = parser.parse_args()

    ptxas, arch = compile_for(args.arch)

    from mamba3_split_probe import case_row, default_point, inputs, kernel_name, outputs

    from opgen.spec import load_spec

    spec = load_spec(ROOT / "specs" / f"{OP}.yaml", ROOT)
    mod = importlib.import_module(f"generated.{OP}.kernels.cuda.{args.variant}")
    overrides = dict(s.split("=", 1) for s in args.set)
    print(f"{'case':<22} {'kernel':<10} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'stack':>6} {'smem':>7}  point")
    for text in args.case:
        row = case_row(spec, text)
        point = default_point(row)
        point.update({k: value(v) for k, v in overrides.items()})
        # a few chunks on the CPU: a kernel's constants (N, P, R, C, the tiles) are the case's
        x = inputs(row, S=4 * row["chunk_size"], device="cpu")
        outs = outputs(x)
        for kernel, grid, kwargs, options in mod.kernel_calls(**x, **outs, num_programs=132, point=point):
            name = kernel_name(kernel)
            if args.kernels and name not in args.kernels:
                continue
            compiled = kernel.warmup(**kwargs, **options, grid=grid)
            use = ptxas_usage(compiled.asm["ptx"], arch, ptxas)
            shown = " ".join(f"{k}={v}" for k, v in sorted(point.items()))
            print(f"{text:<22} {name:<10} {use['regs']:>5} {use['spill_stores']:>9} {use['spill_loads']:>9} "
                  f"{use['stack']:>6} {compiled.metadata.shared:>7}  {shown}", flush=True)
            if args.sass:
                print("    " + sass_mix(compiled.asm["cubin"], Path(args.sass) / f"{text}_{name}.sass"))


if __name__ == "__main__":
    main()
