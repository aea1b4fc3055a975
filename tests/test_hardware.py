"""Chip profiles and device detection."""
import pytest
import torch

from opgen.errors import UnsupportedInput
import dataclasses
import importlib

from opgen.hardware import PROFILES, chip_for_device_name, detect, figures, profile, table_source


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


def test_borrowed_records_freeze_a_chip_without_its_own():
    h100, h200 = profile("h100"), profile("h200")
    assert h100.borrows == "h200" and figures(h100) == figures(h200)
    for lender in {p.borrows for p in PROFILES.values()} - {None}:
        assert all(figures(p) == figures(profile(lender)) for p in PROFILES.values() if p.borrows == lender)
    assert table_source(h100, lambda name: name == "h200") is h200  # none of its own: the lender's
    assert table_source(h100, lambda name: True) is h100  # its own, once it has any
    assert table_source(h100, lambda name: False) is h100  # neither: the spec's defaults
    assert table_source(h200, lambda name: name == "h100") is h200  # h200 borrows from no one
    odd = dataclasses.replace(h100, sm_count=114)
    with pytest.raises(UnsupportedInput, match="borrows the records of h200, whose figures differ"):
        table_source(odd, lambda name: name == "h200")


@pytest.mark.parametrize("op", ["chunk_gla_fwd_o_gk", "mamba3_mimo_bwd_fwd"])
def test_generated_h100_tables_run_the_h200_choices(op):
    """records/h100/ holds none of these ops: each H100 table is the H200 one, saying so."""
    h100 = importlib.import_module(f"generated.{op}.table_h100")
    h200 = importlib.import_module(f"generated.{op}.table_h200")
    assert (h100.CHIP, h200.CHIP) == ("h100", "h200")
    assert h100.CONFIGS == h200.CONFIGS and h100.TUNED == h200.TUNED and h100.FILL == h200.FILL
    assert h100.TUNED and "Frozen from the records of h200" in h100.__doc__
    assert "Frozen from the records" not in h200.__doc__


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
