"""Ray Train reading ferrofeed pipelines: a tiny classifier trained for a few
steps on CPU, its data read by ``ferrofeed.ray.read`` and handed to each
training worker through ``ray.train.get_dataset_shard``.

    python examples/ray_train.py [PATH] [--steps N] [--workers W]

PATH is an ImageFolder tree, WebDataset shards or a URL (default: the
embedded dataset). Prints each worker's losses and the rows it saw.
"""

import argparse
import os
import tempfile

import ray
import torch
from ray import train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

import ferrofeed.ray


def train_loop(config):
    torch.manual_seed(0)
    size = config["size"]
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3 * size * size, 32), torch.nn.ReLU(), torch.nn.Linear(32, config["classes"])
    )
    model = train.torch.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = train.get_dataset_shard("train")
    losses, rows = [], 0
    for step, batch in enumerate(shard.iter_torch_batches(batch_size=config["batch_size"])):
        if step == config["steps"]:
            break
        x = batch["images"].float() / 255.0
        loss = torch.nn.functional.cross_entropy(model(x), batch["labels"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
        rows += len(batch["indices"])
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "model.pt"))
        metrics = {"losses": losses, "rows": rows, "first": losses[0], "last": losses[-1]}
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    a = p.parse_args()
    ray.init(num_cpus=a.workers + 1, include_dashboard=False)
    ds = ferrofeed.ray.read("vision", a.path, epoch=0, batch_size=32, seed=0, transform="train", size=a.size)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": a.steps, "batch_size": 16, "size": a.size, "classes": a.classes},
        scaling_config=ScalingConfig(num_workers=a.workers, use_gpu=False),
        datasets={"train": ds},
        run_config=train.RunConfig(storage_path=os.path.abspath(os.environ.get("RAY_TRAIN_STORAGE", "ray_results"))),
    )
    result = trainer.fit()
    m = result.metrics
    print(f"steps {len(m['losses'])}, rows {m['rows']}, loss {m['first']} -> {m['last']}")
    print("losses", m["losses"])
    print("checkpoint", result.checkpoint.path)
    ray.shutdown()


if __name__ == "__main__":
    main()
