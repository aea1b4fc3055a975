"""Reference of the toy op (y = 2 x) for the tuner's tests."""
import torch


def golden(x, bias=None, out_dtype="float32", device="cpu"):
    return x.detach().to(device=device, dtype=torch.float64) * 2


def reference_fp32(x, bias=None, out_dtype="float32", device="cpu"):
    return x.detach().to(device=device, dtype=torch.float32) * 2


def magnitude(x, bias=None, out_dtype="float32", device="cpu"):
    return golden(x, device=device).abs()


def make_inputs(N, dtype=torch.float32, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(N, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)}
