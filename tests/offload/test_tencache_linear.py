"""LinearFn (the preset GPT's linear layer): its hand-written backward gives torch's own linear gradients
(exactly in fp32; in bf16 the input gradient is computed in a faster layout, so within bf16 rounding)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mlsyskit.tools.offload.model import LinearFn


def grads(fn, x, w, b, g):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    fn(*leaves).backward(g)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("shape", [(2, 3, 16, 8), (2, 32, 96, 128)])
def test_linear_fn_gradients_equal_torch_linear(shape):
    b_, t, d_in, d_out = shape
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(b_, t, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen), torch.randn(d_out)
    g = torch.randn(b_, t, d_out, generator=gen)
    ours, theirs = grads(LinearFn.apply, x, w, b, g), grads(F.linear, x, w, b, g)
    for a, e in zip(ours, theirs, strict=True):
        assert a.shape == e.shape and torch.equal(a, e)
    ours16 = grads(LinearFn.apply, *(v.bfloat16() for v in (x, w, b, g)))
    for a, e in zip(ours16, theirs, strict=True):
        assert a.dtype == torch.bfloat16 and a.shape == e.shape and a.is_contiguous()
        torch.testing.assert_close(a.float(), e, rtol=2e-2, atol=0.15)
