"""DeepSpeed ZeRO-3 peer for scripts/bench_offload_deepspeed.py: trains tencache's GPT preset with the same
seed, batches (corpus.batch), sequence length and thread count, with parameters and optimizer state
offloaded to NVMe or to the CPU. Runs inside the DeepSpeed venv (.bench-venvs/deepspeed), which also sees
mlsyskit's venv for the model and the corpus. Writes one JSON object (per-step wall times and losses,
peak RSS, DeepSpeed's settings) to the file given by --out.

DeepSpeed has no CPU-only ZeRO-3 path of its own: here its CPU accelerator (DS_ACCELERATOR=cpu) is the
"device", a gloo process group of one rank stands in for NCCL, DeepSpeedCPUAdam and the async_io op are
JIT-compiled once (cached under TORCH_EXTENSIONS_DIR), as its GPU path does.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import time

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--offload", choices=("nvme", "cpu"), required=True)
    p.add_argument("--model", default="gpt-350m")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--nvme-dir", default=None)
    p.add_argument("--out", required=True)
    return p.parse_args()


def ds_config(args: argparse.Namespace, largest: int) -> dict:
    """ZeRO-3 with parameters and optimizer state offloaded; bf16 compute with fp32 masters (as tencache).
    Each parameter buffer holds the largest parameter (`largest` elements, rounded up to 1 Mi), and
    prefetching is off (bucket 0): with prefetch on and fewer than 64 buffers, DeepSpeed's parameter
    swapper ran out of buffers on these models (the issue's first attempt)."""
    where = {"device": args.offload, "pin_memory": False}
    if args.offload == "nvme":
        where["nvme_path"] = args.nvme_dir
    buffer_size = -(-largest // (1 << 20)) * (1 << 20)
    param = dict(where, buffer_count=64, buffer_size=buffer_size) if args.offload == "nvme" else dict(where)
    optimizer = dict(where, buffer_count=4) if args.offload == "nvme" else dict(where)
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "offload_param": param, "offload_optimizer": optimizer,
                              "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
                              "stage3_max_live_parameters": int(1e8), "contiguous_gradients": False,
                              "overlap_comm": False},
        "aio": {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    import deepspeed

    from mlsyskit.tools.offload.corpus import batch
    from mlsyskit.tools.offload.model import build_model

    deepspeed.init_distributed(dist_backend="gloo")
    model, _ = build_model(args.model, args.seed)
    config = ds_config(args, max(p.numel() for p in model.parameters()))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    steps, losses = [], []
    for step in range(args.steps):
        x, y = batch(step, args.batch, args.seq, args.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        steps.append({"step": step, "step_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                      "loss": loss.item()})
        losses.append(loss.item())
    result = {"peer": f"deepspeed-zero3-{args.offload}", "deepspeed": deepspeed.__version__,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "steps": steps, "losses": losses,
              "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "config": config}
    with open(args.out, "w") as f:
        json.dump(result, f)
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
