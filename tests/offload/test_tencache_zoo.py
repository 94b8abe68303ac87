"""Model zoo: ordinary nn.Modules, unchanged, trained 7 steps with parameters on all three tiers and
optimizer states partly on NVMe (every step rotates optimizer states through NVMe and the scheduler case's
StepLR changes the rate at step 5, so 7 steps reach every path 20 did; the last step's batch is the first's).

Each model must give per-step losses bit-identical to the plain in-memory reference with the same
arithmetic (bf16 compute, `reference.plain`), and, in fp32, within 1e-5 relative of
torch.optim.AdamW(foreach=False) (+ clip_grad_norm_ / accumulation where the case uses them).
Small shapes, seeded data; budgets are fractions of each model's own (4 KiB-rounded) tensor bytes.
"""
from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlsyskit.tools.offload import Budgets, offload, profile
from mlsyskit.tools.offload.memory import round_up
from mlsyskit.tools.offload.reference import plain

STEPS = 7
VOCAB, SEQ, BATCH = 61, 12, 3


def tokens(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step % 3)  # three batches, cycled: learnable in 7 steps
    x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return x[:, :-1], x[:, 1:]


# -- the zoo -------------------------------------------------------------------------------------------
class OddMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(37, 203), nn.GELU(), nn.Linear(203, 203), nn.Tanh(),
                                 nn.Linear(203, 203), nn.Tanh(), nn.Linear(203, 203), nn.ReLU(),
                                 nn.Linear(203, 53), nn.ReLU(), nn.Linear(53, 7))

    def loss(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step % 3)
        x, y = torch.randn(5, 37, generator=g), torch.randint(0, 7, (5,), generator=g)
        return F.cross_entropy(self(x.to(self.net[0].weight.dtype)).float(), y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TinyGPT(nn.Module):
    """nn.Embedding, nn.MultiheadAttention, nn.LayerNorm, nn.Linear; the head tied to the embedding,
    either as a module (`head.weight = tok.weight`) or used functionally in the parent's forward."""

    def __init__(self, tie: str, shared_block: bool = False) -> None:
        super().__init__()
        d = 48
        self.tie = tie
        self.tok = nn.Embedding(VOCAB, d)
        nn.init.normal_(self.tok.weight, std=0.05)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)  # read functionally, sliced
        self.layers = nn.ModuleList(nn.ModuleDict({
            "attn": nn.MultiheadAttention(d, 4, batch_first=True), "ln1": nn.LayerNorm(d), "ln2": nn.LayerNorm(d),
            "mlp": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))}) for _ in range(3))
        self.ln_f = nn.LayerNorm(d)
        self.shared_block = shared_block
        if tie == "module":
            self.head = nn.Linear(d, VOCAB, bias=False)
            self.head.weight = self.tok.weight

    @staticmethod
    def block(layer: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
        h = layer["ln1"](x)
        mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)
        x = x + layer["attn"](h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + layer["mlp"](layer["ln2"](x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        order = [0, 1, 0, 2] if self.shared_block else [0, 1, 2]  # layer 0 called twice per forward
        for i in order:
            x = self.block(self.layers[i], x)
        x = self.ln_f(x)
        return self.head(x) if self.tie == "module" else x @ self.tok.weight.t()

    def loss(self, step: int) -> torch.Tensor:
        x, y = tokens(step)
        return F.cross_entropy(self(x).float().reshape(-1, VOCAB), y.reshape(-1))


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      *(m for _ in range(3) for m in (nn.Conv2d(16, 16, 3, padding=1),
                                                                      nn.BatchNorm2d(16), nn.ReLU())),
                                      nn.Conv2d(16, 24, 3, stride=2), nn.BatchNorm2d(24), nn.ReLU())
        self.bn1d = nn.BatchNorm1d(24 * 7 * 7)
        self.fc = nn.Linear(24 * 7 * 7, 10)

    def loss(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step % 3)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        return F.cross_entropy(self(x.to(self.fc.weight.dtype)).float(), y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn1d(self.features(x).flatten(1)))


class Frozen(OddMLP):
    def __init__(self) -> None:
        super().__init__()
        for p in self.net[0].parameters():
            p.requires_grad_(False)
        self.net[4].bias.requires_grad_(False)
        self.net[6].weight.requires_grad_(False)


def gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="pip install transformers (the dev extra)")
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=4, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as GPT-2 is

    class HF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt2 = model

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = self.gpt2(input_ids=x).logits
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))

        def loss(self, step: int) -> torch.Tensor:
            return self(*tokens(step))

    return HF()


def groups_optimizer(model: nn.Module, fp32: bool) -> tuple[torch.optim.Optimizer, object]:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "tok" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    emb = [model.tok.weight]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0, "lr": 3e-3},
                             {"params": emb, "lr": 0.0, "betas": (0.8, 0.95)}],  # lr 0: must never change
                            lr=1e-2, foreach=False if fp32 else None)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)


# name -> (factory, accumulate, clip_norm, custom optimizer)
ZOO = {
    "mlp-odd-sizes": (OddMLP, 1, None, False),
    "gpt-tied-module": (lambda: TinyGPT("module"), 1, None, False),
    "gpt-tied-functional": (lambda: TinyGPT("functional"), 1, None, False),
    "gpt-shared-block-clip": (lambda: TinyGPT("module", shared_block=True), 1, 0.5, False),
    "conv-batchnorm": (ConvBN, 1, None, False),
    "frozen-params": (Frozen, 1, None, False),
    "param-groups-scheduler": (lambda: TinyGPT("functional"), 1, None, True),
    "accumulate-4": (OddMLP, 4, None, False),
    "transformers-gpt2": (gpt2, 1, 1.0, False),
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return ZOO[name][0]()


def make_optimizer(name: str, model: nn.Module, fp32: bool):
    if ZOO[name][3]:
        return groups_optimizer(model, fp32)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01,
                             foreach=False), None


def budgets_for(model: nn.Module, nvme, dtype: torch.dtype) -> Budgets:
    """Per size class, about a third of the tensors' (4 KiB-rounded) bytes for the device and for the CPU
    (the rest on NVMe); the optimizer cache about 40% of the fp32 state (the rest rotates through NVMe)."""
    params = list({id(p): p for p in model.parameters()}.values())
    size = torch.empty((), dtype=dtype).element_size()
    dist = Counter(p.numel() * size for p in params)
    device = sum(round_up(s) * max(2 if c > 1 else 1, math.ceil(0.35 * c)) for s, c in dist.items())
    cpu = sum(round_up(s) * max(1, math.ceil(0.3 * c)) for s, c in dist.items())
    states = Counter(16 * p.numel() for p in params if p.requires_grad)
    optimizer = sum(round_up(s) * max(1, math.ceil(0.4 * c)) for s, c in states.items())
    return Budgets(device=device, cpu=cpu, optimizer=optimizer, nvme_dir=nvme)


def run(loop, model: nn.Module, name: str, sched) -> list[float]:
    accumulate = ZOO[name][1]
    losses = []
    for step in range(STEPS):
        loop.begin_step()
        for k in range(accumulate):
            loss = model.loss(step * accumulate + k) / accumulate
            loop.backward(loss)
            losses.append(loss.item())
        if sched is not None:
            sched.step()
    return losses


def offloaded(name: str, nvme, dtype: torch.dtype) -> tuple[list[float], nn.Module]:
    model = build(name)
    opt, sched = make_optimizer(name, model, dtype == torch.float32)
    prof = profile(model, lambda m: m.loss(0), name=name, dtype=dtype)
    _, accumulate, clip, _ = ZOO[name]
    with offload(model, opt, budgets_for(model, nvme, dtype), prof, dtype=dtype, accumulate=accumulate,
                 clip_norm=clip, device=torch.device("cpu")) as engine:  # emulated device, also on a GPU machine
        occ = engine.occupancy()
        assert all(occ["bytes"][t] > 0 for t in ("device", "cpu", "nvme")), occ["bytes"]
        assert occ["optimizer_nvme_tensors"] > 0
        losses = run(engine, model, name, sched)
        assert engine.stats.tensor_uses > 0
    return losses, model


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_bit_identical_to_plain_reference(name, tmp_path):
    losses, trained = offloaded(name, tmp_path, torch.bfloat16)
    model = build(name)
    opt, sched = make_optimizer(name, model, False)
    with plain(model, opt, dtype=torch.bfloat16, accumulate=ZOO[name][1], clip_norm=ZOO[name][2]) as ref:
        expected = run(ref, model, name, sched)
    assert losses == expected
    assert math.isfinite(losses[-1]) and losses[-1] < losses[0]
    # handed back as ordinary parameters in their original dtype, equal to the reference's masters
    for (n, p), (_, q) in zip(trained.named_parameters(), model.named_parameters(), strict=True):
        assert p.dtype == torch.float32 and p.shape == q.shape, n
    if name == "param-groups-scheduler":
        assert torch.equal(trained.tok.weight, build(name).tok.weight)  # lr 0 group: unchanged
    if name == "frozen-params":
        assert torch.equal(trained.net[0].weight, build(name).net[0].weight)
    if name == "conv-batchnorm":
        bn = trained.bn1d
        assert bn.running_mean.dtype == torch.float32 and bn.num_batches_tracked.item() == STEPS
        assert not torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_fp32_matches_torch_adamw(name, tmp_path):
    losses, _ = offloaded(name, tmp_path, torch.float32)
    model = build(name)
    opt, sched = make_optimizer(name, model, True)
    _, accumulate, clip, _ = ZOO[name]
    expected = []
    for step in range(STEPS):
        for k in range(accumulate):
            loss = model.loss(step * accumulate + k) / accumulate
            loss.backward()
            expected.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
    assert losses == pytest.approx(expected, rel=1e-5, abs=0)


def test_profile_records_functional_and_saved_uses():
    model = build("gpt-tied-functional")
    prof = profile(model, lambda m: m.loss(0), name="tied")
    labels = [(u.module, u.phase) for u in prof.uses]
    assert labels[0] == ("", "forward")  # the root owns `pos` (sliced in its forward): held for the forward
    assert ("fn:tok.weight", "forward") in labels  # the tied head, used functionally
    assert ("fn:layers.0.attn.out_proj.weight", "forward") in labels  # MultiheadAttention passes out_proj.weight
    assert any(m == "saved:tok.weight" and ph == "backward" for m, ph in labels)
    assert sorted(prof.optimizer_order) == list(range(len(prof.tensors)))


def test_tied_weight_is_one_tensor(tmp_path):
    model = build("gpt-tied-module")
    names = [t.name for t in profile(model, lambda m: m.loss(0)).tensors]
    assert "tok.weight" in names and "head.weight" not in names


@pytest.mark.parametrize("name", ["mlp-odd-sizes", "conv-batchnorm"])
def test_model_unchanged_by_profiling(name):
    """Profiling runs the model itself in bf16 (no full-precision copy) and hands its tensors back:
    parameters, dtypes and BatchNorm statistics (num_batches_tracked included) as they were."""
    model = build(name)
    before = copy.deepcopy(model.state_dict())
    profile(model, lambda m: m.loss(0))
    after = model.state_dict()
    assert all(torch.equal(before[k], v) and before[k].dtype == v.dtype for k, v in after.items())
    assert all(p.grad is None for p in model.parameters())
