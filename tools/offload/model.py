"""A GPT-style decoder with OPT's tensor shapes: learned positions, pre-LayerNorm blocks with biased
q/k/v/out projections (d x d), a 4d MLP (4d x d, d x 4d) and an untied byte-level output head.

Every leaf module holds its own parameters and calls them through torch.nn.functional, so module
hooks see exactly which tensors each step of the computation uses. Parameters are bf16 compute copies;
`build_model` also returns the fp32 initial values that become the optimizer's master weights.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.offload.corpus import VOCAB_SIZE


@dataclass(frozen=True)
class GPTConfig:
    d_model: int
    n_layers: int
    n_heads: int
    vocab: int = VOCAB_SIZE
    max_seq: int = 1024

    @property
    def n_params(self) -> int:
        d, L = self.d_model, self.n_layers
        per_layer = 4 * (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 4 * d
        return self.vocab * d + self.max_seq * d + L * per_layer + 2 * d + self.vocab * d


PRESETS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(32, 2, 2, max_seq=128),
    "gpt-small": GPTConfig(64, 4, 4, max_seq=256),
    "gpt-10m": GPTConfig(256, 12, 4),
    "gpt-50m": GPTConfig(512, 16, 8),
    "gpt-125m": GPTConfig(768, 12, 12),
    "gpt-350m": GPTConfig(1024, 24, 16),
    "gpt-760m": GPTConfig(1536, 24, 16),
    "gpt-1.3b": GPTConfig(2048, 24, 32),
}


def preset(name: str) -> GPTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


class LinearFn(torch.autograd.Function):
    """F.linear that saves the weight Parameter itself for backward, not a transposed view of its storage,
    so backward reads whatever storage the parameter has *then* (the offload engine swaps it in and out)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_w = flat.t() @ x.reshape(-1, x.shape[-1])
        # grad @ weight with grad column-major (a small copy of the activations' gradient): torch's CPU bf16
        # gemm without AVX-512 runs the row-major x row-major case ~20x slower than this layout (it was 90%
        # of a gpt-50m step's CPU time, for tencache and for DeepSpeed, which runs this model too)
        grad_x = flat.t().contiguous().t() @ weight
        return grad_x.view(*grad.shape[:-1], weight.shape[1]), grad_w, (flat.sum(0) if ctx.has_bias else None)


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        nn.init.normal_(self.weight, std=0.02)  # a no-op on the meta device (build_model initialises)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LinearFn.apply(x, self.weight, self.bias)


class LayerNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.weight)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1 = LayerNorm(d)
        self.q, self.k, self.v, self.o = Linear(d, d), Linear(d, d), Linear(d, d), Linear(d, d)
        self.ln2 = LayerNorm(d)
        self.fc1, self.fc2 = Linear(d, 4 * d), Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = Embedding(cfg.vocab, cfg.d_model)
        self.pos = Embedding(cfg.max_seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = LayerNorm(cfg.d_model)
        self.head = Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.max_seq:
            raise ValueError(f"sequence length {t} exceeds the model's maximum {self.cfg.max_seq}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class InitialWeights(Mapping[str, torch.Tensor]):
    """The fp32 initial weights by parameter name, generated on access from a generator seeded per tensor
    (sub_seed(seed, "init:<name>")): any one tensor's value is independent of every other's and of the
    order they are asked for, so the model's fp32 weights never sit in memory all at once (a tier is
    populated one tensor at a time) and a lazily built model gets exactly a plain build's values."""

    def __init__(self, cfg: GPTConfig, shapes: dict[str, torch.Size], seed: int) -> None:
        self.cfg, self.shapes, self.seed = cfg, shapes, seed

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        fp32 = torch.empty(self.shapes[name], dtype=torch.float32)
        if name.endswith("bias"):
            return fp32.zero_()
        if ".ln" in name or name.startswith("ln_f"):
            return fp32.fill_(1.0)
        std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o.weight", "fc2.weight")) else 0.02
        gen = torch.Generator().manual_seed(sub_seed(self.seed, f"init:{name}"))
        return fp32.normal_(0.0, std, generator=gen)

    def __contains__(self, name: object) -> bool:  # without generating the value (Mapping's would)
        return name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def build_model(name: str, seed: int, *, dtype: torch.dtype = torch.bfloat16,
                lazy: bool = False) -> tuple[GPT, InitialWeights]:
    """The model in `dtype` (compute copies) and its fp32 initial weights by parameter name (generated per
    access, one tensor at a time). `lazy`: the parameters stay on the meta device (no memory): the engine
    generates each one straight into its tier (`OffloadEngine(model, initial_weights, ...)`)."""
    cfg = preset(name)
    with torch.device("meta"):
        model = GPT(cfg).to(dtype)
    masters = InitialWeights(cfg, {n: p.shape for n, p in model.named_parameters()}, seed)
    if lazy:
        return model, masters
    model = model.to_empty(device="cpu")
    for pname, p in model.named_parameters():
        p.data = masters[pname].to(dtype)
    return model, masters
