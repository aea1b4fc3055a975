"""Chip profiles: on-chip memory sizes and core counts, and device detection.

Every number cites its source in the profile's ``source``. Ascend figures come from CANN's
platform configs (``platform_config/Ascend910B*.ini``), the CANN docs and the Triton-Ascend
programming guide; NVIDIA figures from the CUDA programming guide's compute-capability table. Detection imports torch (and torch_npu) inside
the function only, so the driver imports where no device stack is installed. Uses ``errors``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedInput

KiB = 1024


def rendering_of(backend: str) -> str:
    """The kernel rendering a backend runs: ``cuda`` on NVIDIA, else the Ascend one (``npu``),
    which the CPU interpreter runs too."""
    return "cuda" if backend == "cuda" else "npu"


@dataclass(frozen=True)
class ChipProfile:
    """One chip. Sizes in bytes; ``None`` where no public source gives the figure.

    Attributes:
        name: the table name (``ascend910b3``, ``h200``, ``interpreter``).
        backend: ``npu``, ``cuda`` or ``interpreter``.
        device_names: substrings of the driver's device name that identify the chip.
        ub_bytes: Unified Buffer per vector core (Ascend).
        l1_bytes, l0a_bytes, l0b_bytes, l0c_bytes: cube-side buffers (Ascend).
        cube_cores, vector_cores: AI-core counts (Ascend); a dot kernel launches cube_cores.
        smem_bytes: shared memory a block may use (NVIDIA).
        sm_count: streaming multiprocessors (NVIDIA).
        compute_capability: the target a kernel is compiled for (NVIDIA; 90: sm_90a).
        sm_smem_bytes, sm_registers, sm_threads, sm_ctas: what one multiprocessor holds at once
            (NVIDIA): shared memory, 32-bit registers, threads and blocks; with a kernel's
            registers, shared memory and warps they bound its blocks per multiprocessor.
        programs: persistent-grid programs for the interpreter.
        source: where the figures come from.
        inherits: the chip whose records this chip's are read after (:func:`inherited`): one with
            the same backend and figures, so that the same kernels fit and compile alike. Its
            winners and measures serve every bucket this chip has measured nothing of; the
            timings behind them were taken on that chip.
    """

    name: str
    backend: str
    device_names: tuple[str, ...] = ()
    ub_bytes: int | None = None
    l1_bytes: int | None = None
    l0a_bytes: int | None = None
    l0b_bytes: int | None = None
    l0c_bytes: int | None = None
    cube_cores: int | None = None
    vector_cores: int | None = None
    smem_bytes: int | None = None
    sm_count: int | None = None
    compute_capability: int | None = None
    sm_smem_bytes: int | None = None
    sm_registers: int | None = None
    sm_threads: int | None = None
    sm_ctas: int | None = None
    programs: int | None = None
    source: str = ""
    inherits: str | None = None

    @property
    def cores(self) -> int:
        """Programs of a persistent grid: cube cores, SMs, or the interpreter's count."""
        count = {"npu": self.cube_cores, "cuda": self.sm_count}.get(self.backend, self.programs)
        if count is None:
            raise UnsupportedInput(f"chip {self.name}: core count unknown; read it from the driver")
        return count

    @property
    def rendering(self) -> str:
        """Which kernel rendering serves this chip (:func:`rendering_of` its backend)."""
        return rendering_of(self.backend)

    def budget(self, kind: str) -> int:
        """The byte budget a formula of ``kind`` (``ub_bytes``/``smem_bytes``) is checked against."""
        value = {"ub_bytes": self.ub_bytes, "smem_bytes": self.smem_bytes}.get(kind)
        if value is None:
            raise UnsupportedInput(f"chip {self.name} has no {kind} budget")
        return value


_A2 = dict(  # Atlas A2: CANN platform_config Ascend910B*.ini (ub_size=196608, l1 524288, l0a/b 65536, l0c 131072)
    ub_bytes=192 * KiB, l1_bytes=512 * KiB, l0a_bytes=64 * KiB, l0b_bytes=64 * KiB, l0c_bytes=128 * KiB,
)
# CUDA guide, cc 9.0: 227 KB of shared memory per block, 228 KB per SM, 64 K registers, 2048
# threads and 32 blocks per SM; SXM parts: 132 SMs
_HOPPER = dict(smem_bytes=227 * KiB, sm_count=132, compute_capability=90, sm_smem_bytes=228 * KiB,
               sm_registers=64 * KiB, sm_threads=2048, sm_ctas=32)

PROFILES: dict[str, ChipProfile] = {p.name: p for p in (
    ChipProfile("ascend910b1", "npu", ("Ascend910B1",), cube_cores=24, vector_cores=48, **_A2,
                source="CANN platform_config Ascend910B1.ini; triton-ascend programming guide (UB 192 KB)"),
    ChipProfile("ascend910b2", "npu", ("Ascend910B2",), cube_cores=24, vector_cores=48, **_A2,
                source="CANN platform_config Ascend910B2.ini"),
    ChipProfile("ascend910b3", "npu", ("Ascend910B3",), cube_cores=20, vector_cores=40, **_A2,
                source="CANN platform_config Ascend910B3.ini (ub_size=196608)"),
    ChipProfile("ascend910b4", "npu", ("Ascend910B4",), cube_cores=20, vector_cores=40, **_A2,
                source="CANN platform_config Ascend910B4.ini"),
    ChipProfile("ascend910_93", "npu", ("Ascend910_93",), cube_cores=24, vector_cores=48, **_A2,
                source="Atlas A3: UB treated as A2's 192 KB until measured (no public figure); "
                       "cores per die as 910B1, unverified: the driver's count is used at run time"),
    ChipProfile("ascend950", "npu", ("Ascend950",), ub_bytes=248 * KiB,
                source="CANN docs: 248 KB UB on Ascend 950 / Atlas 350 (216 KB in mixed SIMD/SIMT "
                       "mode); L1/L0 sizes and core counts not published: read from the driver"),
    ChipProfile("h100", "cuda", ("H100",), **_HOPPER, source="CUDA programming guide, cc 9.0; H100 SXM",
                inherits="h200"),
    ChipProfile("h200", "cuda", ("H200",), **_HOPPER,
                source="CUDA programming guide, cc 9.0; 132 SMs as torch reports them on an H200"),
    ChipProfile("interpreter", "interpreter", (), programs=4,
                source="Triton CPU interpreter: numerics only, no on-chip memory to budget"),
)}


def profile(name: str) -> ChipProfile:
    """The profile called ``name``.

    Raises:
        UnsupportedInput: for an unknown chip, listing the known ones.
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise UnsupportedInput(f"unknown chip {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def figures(chip: ChipProfile) -> dict[str, Any]:
    """What a chip's kernels see of it: every figure but its names, source and inheritance."""
    return {f.name: getattr(chip, f.name) for f in dataclasses.fields(chip)
            if f.name not in ("name", "device_names", "source", "inherits")}


def inherited(chip: ChipProfile) -> ChipProfile | None:
    """The chip whose records ``chip`` reads before its own (``inherits``), or None.

    Raises:
        UnsupportedInput: a parent chip whose figures differ from ``chip``'s.
    """
    if chip.inherits is None:
        return None
    found = profile(chip.inherits)
    if figures(found) != figures(chip):
        raise UnsupportedInput(f"chip {chip.name} inherits the records of {found.name}, whose figures differ")
    return found


def chip_for_device_name(device_name: str, backend: str) -> ChipProfile:
    """Match a driver's device name (``NVIDIA H200``, ``Ascend910B3``) to a profile."""
    for prof in PROFILES.values():
        if prof.backend == backend and any(s in device_name for s in prof.device_names):
            return prof
    raise UnsupportedInput(f"no {backend} chip profile matches device {device_name!r}; "
                           f"known: {', '.join(sorted(PROFILES))}")


def detect(tensor: Any, *, interpret: bool) -> ChipProfile:
    """The profile of the chip that holds ``tensor``.

    Args:
        tensor: a torch tensor (only ``.device`` is read).
        interpret: whether the Triton interpreter is active (``TRITON_INTERPRET=1``), which is
            the only way CPU tensors are served.

    Raises:
        UnsupportedInput: for a CPU tensor without the interpreter, or an unknown chip.
    """
    device = tensor.device
    if device.type == "cpu":
        if not interpret:
            raise UnsupportedInput("CPU tensors run only under the Triton interpreter (TRITON_INTERPRET=1)")
        return PROFILES["interpreter"]
    if device.type == "cuda":
        import torch

        return chip_for_device_name(torch.cuda.get_device_name(device), "cuda")
    if device.type == "npu":
        import torch

        return chip_for_device_name(torch.npu.get_device_name(device), "npu")  # type: ignore[attr-defined]
    raise UnsupportedInput(f"no chip profile for device type {device.type!r}")
