"""One torchrun rank for test_tencache_ranks.py: the library API with `ranks=` on a small model, then the CLI.

    torchrun --nproc-per-node 2 ranks_worker.py OUT_DIR -- <tencache train arguments>

The library part: `offload(model, opt, budgets, prof, ranks=RankGroup.from_env())`, rank r feeding micro-batch
2*step + r, 2 steps; at exit every rank holds the whole model again, saved to OUT_DIR/api-rank<r>.pt. `api_run`
with world=1 and accumulate=2 is the single-process reference. Then `tencache train` with the given
arguments in this process (it reuses the process group)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from mlsyskit.tools.offload import Budgets, RankGroup, offload, profile

STEPS = 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.Linear(64, 4))
    model[3].bias.requires_grad_(False)  # a frozen parameter: owned, gathered, never updated
    return model


def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + k)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def api_run(ranks: RankGroup | None, accumulate: int) -> dict[str, torch.Tensor]:
    model = make_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    loss_of = lambda m, xy: nn.functional.cross_entropy(m(xy[0].bfloat16()).float(), xy[1])  # noqa: E731
    prof = profile(model, lambda m: loss_of(m, batch(0)), name="mlp")
    world, rank = (ranks.world, ranks.rank) if ranks is not None else (1, 0)
    budgets = Budgets(device=40 << 10, cpu=1 << 20, optimizer=1 << 20)
    with offload(model, opt, budgets, prof, device=torch.device("cpu"), accumulate=accumulate, clip_norm=1.0,
                 ranks=ranks) as engine:
        for step in range(STEPS):
            engine.begin_step()
            for k in range(accumulate):
                engine.backward(loss_of(model, batch(step * world * accumulate + rank * accumulate + k)))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(argv: list[str]) -> None:
    out, cli_args = Path(argv[0]), argv[argv.index("--") + 1:]
    ranks = RankGroup.from_env("cpu", 120.0)
    torch.save(api_run(ranks, 1), out / f"api-rank{ranks.rank}.pt")
    from mlsyskit.tools.offload import cli

    sys.argv = ["tencache", "train", *cli_args]
    try:
        cli.main()  # exits with the CLI's code; its run reuses this process group
    finally:
        ranks.close()


if __name__ == "__main__":
    main(sys.argv[1:])
