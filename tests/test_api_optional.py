"""Generated APIs with optional tensors, a dtype argument and conditional outputs (the toy op)."""
import importlib
import shutil
import sys
from pathlib import Path

import pytest
import torch

from opgen.build import freeze

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy_op(tmp_path_factory):
    root = tmp_path_factory.mktemp("toyapi")
    shutil.copytree(Path(__file__).parent / "toy_project", root, dirs_exist_ok=True)
    freeze.write(root, freeze.build_all(root))
    shutil.move(str(root / "generated"), str(root / "toygen"))  # `generated` is this repo's package
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("toygen.toy_op").toy_op
    finally:
        sys.path.remove(str(root))


def test_optional_input_absent_gives_none_output(toy_op):
    x = torch.randn(50)
    y, y_plus = toy_op(x)
    assert y_plus is None and y.dtype == torch.float32
    torch.testing.assert_close(y, 2 * x)


def test_optional_input_given_gives_its_output_in_the_asked_dtype(toy_op):
    x, bias = torch.randn(50), torch.randn(50)
    y, y_plus = toy_op(x, bias, out_dtype=torch.float16)
    assert y.dtype == y_plus.dtype == torch.float16
    torch.testing.assert_close(y_plus.float(), (2 * x).half().float() + bias, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(bias=torch.randn(7)), ValueError, r"bias\.shape\[0\] must be N = 50 \(from x\.shape\[0\]\), got 7"),
    (dict(bias=torch.randn(50).half()), TypeError, r"bias\.dtype must be one of float32"),
    (dict(out_dtype=torch.int32), ValueError, r"out_dtype must be one of float32, float16, got torch\.int32"),
    (dict(out_dtype="float32"), TypeError, r"out_dtype must be a torch\.dtype, got str"),
])
def test_bad_optional_and_dtype_arguments(toy_op, kwargs, exc, pattern):
    with pytest.raises(exc, match="^toy_op: " + pattern):
        toy_op(torch.randn(50), **kwargs)
