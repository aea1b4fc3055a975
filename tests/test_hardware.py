"""Chip profiles and device detection."""
import pytest
import torch

from opgen.errors import UnsupportedInput
import dataclasses

from opgen.spec.hardware import PROFILES, chip_for_device_name, detect, figures, inherited, profile


def test_ascend_figures():
    for name in ("ascend910b1", "ascend910b2", "ascend910b3", "ascend910b4", "ascend910_93"):
        p = profile(name)
        assert p.backend == "npu" and p.ub_bytes == 196608 == p.budget("ub_bytes")
        assert p.l0a_bytes == p.l0b_bytes == 65536 and p.l0c_bytes == 131072 and p.l1_bytes == 524288
        assert p.vector_cores == 2 * p.cube_cores and p.cores == p.cube_cores
    assert profile("ascend910b1").cube_cores == 24 and profile("ascend910b3").cube_cores == 20
    assert profile("ascend950").ub_bytes == 248 * 1024
    with pytest.raises(UnsupportedInput, match="core count unknown"):
        profile("ascend950").cores


def test_nvidia_figures():
    for name in ("h100", "h200"):
        p = profile(name)
        assert p.smem_bytes == 232448 and p.sm_count == 132 and p.rendering == "cuda"
        with pytest.raises(UnsupportedInput, match="no ub_bytes budget"):
            p.budget("ub_bytes")


def test_every_profile_cites_a_source():
    assert all(p.source for p in PROFILES.values())


def test_a_lender_shares_every_figure():
    h100, h200 = profile("h100"), profile("h200")
    assert inherited(h100) is h200 and figures(h100) == figures(h200) and inherited(h200) is None
    for p in PROFILES.values():
        assert inherited(p) is None or figures(inherited(p)) == figures(p)
    odd = dataclasses.replace(h100, sm_count=114)
    with pytest.raises(UnsupportedInput, match="inherits the records of h200, whose figures differ"):
        inherited(odd)


def test_device_name_matching():
    assert chip_for_device_name("NVIDIA H200", "cuda").name == "h200"
    assert chip_for_device_name("Ascend910B3", "npu").name == "ascend910b3"
    with pytest.raises(UnsupportedInput, match="no cuda chip profile matches device 'NVIDIA A100"):
        chip_for_device_name("NVIDIA A100-SXM4-80GB", "cuda")
    with pytest.raises(UnsupportedInput, match="unknown chip 'tpu'"):
        profile("tpu")


def test_detect_cpu_needs_interpreter():
    x = torch.zeros(1)
    assert detect(x, interpret=True).name == "interpreter"
    with pytest.raises(UnsupportedInput, match="TRITON_INTERPRET=1"):
        detect(x, interpret=False)
    with pytest.raises(UnsupportedInput, match="device type 'meta'"):
        detect(torch.zeros(1, device="meta"), interpret=True)
