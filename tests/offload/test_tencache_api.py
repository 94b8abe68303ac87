"""Library API: wrap a user's own nn.Module with tencache.offload and train it."""
from __future__ import annotations

import torch
from torch import nn

from mlsyskit.tools.offload import Budgets, offload, profile
from mlsyskit.tools.offload.model import Linear


class TwoLayer(nn.Module):
    """A user's model: embedding, LayerNorm, four MLP blocks with residuals, a head."""

    def __init__(self, linear=Linear) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.norm = nn.LayerNorm(32)
        self.blocks = nn.ModuleList(nn.ModuleDict({"up": linear(32, 128), "down": linear(128, 32)}) for _ in range(4))
        self.head = linear(32, 64)

    def forward(self, x, y):
        h = self.norm(self.emb(x))
        for b in self.blocks:
            h = h + b["down"](torch.relu(b["up"](h)))
        return nn.functional.cross_entropy(self.head(h).float().view(-1, 64), y.view(-1))


def data(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 64, (4, 16), generator=g)
    return x, (x * 7 + 3) % 64  # a learnable mapping


def plain_losses(steps):
    torch.manual_seed(0)
    model = TwoLayer().to(torch.bfloat16)
    torch.manual_seed(0)
    ref = TwoLayer()
    masters = {n: p.detach().float().clone() for n, p in ref.named_parameters()}
    model.load_state_dict({n: p.to(torch.bfloat16) for n, p in masters.items()})
    from mlsyskit.tools.offload.optimizer import AdamConfig, adam_update

    ms = {n: torch.zeros_like(p) for n, p in masters.items()}
    vs = {n: torch.zeros_like(p) for n, p in masters.items()}
    losses = []
    for step in range(steps):
        loss = model(*data(step))
        loss.backward()
        for n, p in model.named_parameters():
            adam_update(masters[n].view(-1), p.grad.reshape(-1).float(), ms[n].view(-1), vs[n].view(-1), step + 1,
                        AdamConfig(lr=1e-2))
            p.data.copy_(masters[n])
            p.grad = None
        losses.append(loss.item())
    return losses


def test_offload_user_model_matches_plain_training(tmp_path):
    torch.manual_seed(0)
    model = TwoLayer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    prof = profile(model, lambda m: m(*data(0)), name="two-layer")
    budgets = Budgets(device=40 * 1024, cpu=40 * 1024, optimizer=400 * 1024, nvme_dir=tmp_path)
    losses = []
    with offload(model, opt, budgets, prof) as engine:
        occ = engine.occupancy()
        assert all(occ["bytes"][tier] > 0 for tier in ("device", "cpu", "nvme")) and occ["optimizer_nvme_tensors"]
        for step in range(20):
            engine.begin_step()
            loss = model(*data(step))
            engine.backward(loss)
            losses.append(loss.item())
    assert losses == plain_losses(20)
    assert losses[-1] < losses[0]
    up = model.blocks[0]["up"].weight
    assert up.shape == (128, 32) and up.dtype == torch.float32  # handed back in their original dtype

