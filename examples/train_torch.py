"""Train an encoder with PyTorch on fdsl's closed-form gradients: one process, a GPU, or many
processes and machines with torch.distributed.

    fdsl codegen examples/deep.fd --form 'form(E)' --target torch -o deep_torch.py
    python examples/train_torch.py deep_torch.py --steps 200                 # CPU
    python examples/train_torch.py deep_torch.py --device cuda --dtype float32
    torchrun --nproc-per-node 2 examples/train_torch.py deep_torch.py        # data parallel (gloo)

The generated module's ``Model`` holds the weights as parameters; calling it on a batch of
sequences returns the loss 1/2 ||E||^2 summed over the batch, and its backward is fdsl's gradient
(``FdslLoss``). Under torchrun every process trains on its own share of the batch and
DistributedDataParallel averages the gradients (nccl on GPUs, gloo on CPUs). The data here is a
fixed random batch drawn from one seed, so every run and every process count sees the same.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def load(path: str):
    spec = importlib.util.spec_from_file_location("fdsl_generated_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help="the module fdsl codegen --target torch wrote")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step, over all processes")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--every", type=int, default=10, help="print the loss every N steps")
    args = parser.parse_args(argv)

    m = load(args.module)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:  # started by torchrun: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = torch.distributed.get_rank()
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    if args.batch % world:
        raise SystemExit("--batch %d does not split over %d processes" % (args.batch, world))

    g = torch.Generator().manual_seed(0)  # the same weights and data in every process
    model = m.Model(dtype=dtype, generator=g).to(device)
    data = {name: torch.randn((args.batch,) + shape, generator=g, dtype=dtype) for name, shape in m.DATA.items()}
    share = args.batch // world
    mine = {name: x[rank * share:(rank + 1) * share].to(device) for name, x in data.items()}
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimiser = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps + 1):
        optimiser.zero_grad()
        loss = model(**mine)
        if step % args.every == 0 or step == args.steps:
            total = loss.detach().clone()
            if world > 1:
                torch.distributed.all_reduce(total)
            if rank == 0:
                print("step %5d  loss %.6e" % (step, float(total)), flush=True)
        if not torch.isfinite(loss.detach()).item():  # nan or inf: every step after would be too
            print("step %d: the loss is %s; training stopped: it diverges (lower --lr, it is %g)"
                  % (step, float(loss), args.lr), file=sys.stderr)
            return 1
        if step == args.steps:
            break
        loss.backward()  # fdsl's closed-form gradient; DDP averages it over the processes
        optimiser.step()
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
