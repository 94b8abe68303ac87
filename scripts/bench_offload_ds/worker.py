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
import threading
import time

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--offload", choices=("nvme", "cpu"), required=False)
    p.add_argument("--model", default="gpt-350m")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--nvme-dir", default=None)
    p.add_argument("--aio", default=None, help="JSON of the aio section (from --tune-aio)")
    p.add_argument("--optimizer-swap", choices=("pipelined", "sync"), default="pipelined",
                   help="NVMe optimizer-state swapping: pipelined over sub-groups, or DeepSpeed's default (one "
                        "sub-group, synchronous)")
    p.add_argument("--tune-aio", action="store_true",
                   help="sweep DeepSpeed's aio settings on --nvme-dir and write the best to --out")
    p.add_argument("--out", required=True)
    return p.parse_args()


def ds_config(args: argparse.Namespace, hidden: int, largest: int, n_params: int) -> dict:
    """ZeRO-3 with DeepSpeed's recommended ZeRO-Infinity settings; bf16 compute with fp32 masters (as tencache).

    The "auto" values of DeepSpeed's Hugging Face integration, from the hidden size h: reduce bucket h^2,
    prefetch bucket 0.9 h^2, parameter persistence threshold 10 h; overlap_comm and contiguous_gradients on;
    max live parameters and reuse distance at their defaults (1e9). NVMe: parameter buffers at the documented
    defaults (5 buffers, max_in_cpu 1e9), each at least the largest parameter; the aio section tuned for
    this disk (--tune-aio, a reduced ds_nvme_tune sweep) and passed in --aio. Optimizer swapping
    ("pipelined", the faster here): reads and writes pipelined over sub-groups of 1e8 elements, or a quarter
    of the model when that is smaller, so the pipeline has tiles to overlap. Each sub-group holds 4 buffers
    (fp32 master, m, v, gradient; the documented minimum for Adam) and 3 are in flight at once (the
    previous one being written, the current one, the next one being read), so 12 buffers: with the
    documented 4, DeepSpeed's first step fails (`new_alloc_buffers is not None`: m and v get no buffer).
    "sync" is DeepSpeed's default (no pipelining, 4 buffers, sub_group_size 1e9)."""
    where = {"device": args.offload, "pin_memory": True}
    if args.offload == "nvme":
        where["nvme_path"] = args.nvme_dir
    buffer_size = max(int(1e8), -(-largest // (1 << 20)) * (1 << 20))
    param = dict(where, buffer_count=5, buffer_size=buffer_size, max_in_cpu=int(1e9)) \
        if args.offload == "nvme" else dict(where)
    pipelined = args.offload == "nvme" and args.optimizer_swap == "pipelined"
    if pipelined:  # 4 buffers per sub-group (fp32 master, m, v, gradient) x 3 sub-groups in flight
        optimizer = dict(where, buffer_count=12, pipeline_read=True, pipeline_write=True)
    else:
        optimizer = dict(where, buffer_count=4) if args.offload == "nvme" else dict(where)
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "offload_param": param, "offload_optimizer": optimizer,
                              "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": hidden * hidden,
                              "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                              "stage3_param_persistence_threshold": 10 * hidden,
                              "stage3_max_live_parameters": int(1e9), "stage3_max_reuse_distance": int(1e9),
                              "sub_group_size": int(1e9) if args.offload == "nvme" and not pipelined
                              else min(int(1e8), -(-n_params // 4))},
    }
    if args.aio:
        config["aio"] = json.loads(args.aio)
    return config


def tune_aio(nvme_dir: str, out: str) -> None:
    """A reduced ds_nvme_tune: DeepSpeed's own aio handle reads and writes a 64 MiB file on the NVMe folder
    for each setting; the best read + write GB/s wins (ds_nvme_tune's rule). The full sweep (ds_nvme_tune)
    takes far longer than a benchmark run on a busy 2-core machine."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()
    nbytes = 64 << 20
    buf = torch.empty(nbytes, dtype=torch.uint8)
    buf.random_(0, 255)
    path = os.path.join(nvme_dir, "aio-tune.bin")
    results = []
    for block in (1 << 18, 1 << 20):
        for depth in (8, 32):
            for threads in (1, 2):
                handle = aio.aio_handle(block, depth, False, True, threads)
                t0 = time.perf_counter()
                handle.sync_pwrite(buf, path)
                write = nbytes / (time.perf_counter() - t0) / 1e9
                t0 = time.perf_counter()
                handle.sync_pread(buf, path)
                read = nbytes / (time.perf_counter() - t0) / 1e9
                results.append({"block_size": block, "queue_depth": depth, "intra_op_parallelism": threads,
                                "read_GBps": read, "write_GBps": write})
    os.unlink(path)
    best = max(results, key=lambda r: r["read_GBps"] + r["write_GBps"])
    aio_section = {"block_size": best["block_size"], "queue_depth": best["queue_depth"],
                   "intra_op_parallelism": best["intra_op_parallelism"], "single_submit": False,
                   "overlap_events": True}
    with open(out, "w") as f:
        json.dump({"aio": aio_section, "sweep": results}, f)


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The process's largest VmRSS, sampled every 20 ms while training runs."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    if args.tune_aio:
        tune_aio(args.nvme_dir, args.out)
        return
    import deepspeed

    from mlsyskit.tools.offload.corpus import batch
    from mlsyskit.tools.offload.model import build_model, preset

    deepspeed.init_distributed(dist_backend="gloo")
    baseline = rss()  # torch, DeepSpeed and the process group, before the model exists
    model, _ = build_model(args.model, args.seed)  # the same initial weights as tencache's (same seed)
    config = ds_config(args, preset(args.model).d_model, max(p.numel() for p in model.parameters()),
                       sum(p.numel() for p in model.parameters()))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    steps, losses = [], []
    sampler = RssSampler()
    for step in range(args.steps):
        x, y = batch(step, args.batch, args.seq, args.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        steps.append({"step": step, "step_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                      "loss": loss.item()})
        losses.append(loss.item())
    training_peak = sampler.stop()
    result = {"peer": f"deepspeed-zero3-{args.offload}", "deepspeed": deepspeed.__version__,
              "baseline_rss": baseline, "training_peak_rss": training_peak,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "steps": steps, "losses": losses,
              "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "config": config}
    with open(args.out, "w") as f:
        json.dump(result, f)
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
