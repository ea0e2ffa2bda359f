"""A tiny CPU program for torchrun: each rank times a few gloo ``all_reduce`` steps.

    torchrun --nproc-per-node 2 torchrun_train.py [STEPS]

Each rank prints ``rank R of W (local L, node N): [sum...]`` at the end.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from otel_rl.timers import hierarchical_timer

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.zeros(4)
    with hierarchical_timer("train"):
        for _ in range(STEPS):
            with hierarchical_timer("step"):
                with hierarchical_timer("compute"):
                    grad = torch.ones(4) * (rank + 1)
                with hierarchical_timer("all_reduce"):
                    dist.all_reduce(grad)
                total += grad
    print(f"rank {rank} of {world} (local {os.environ['LOCAL_RANK']}, "
          f"node {os.environ['GROUP_RANK']}): {total.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
