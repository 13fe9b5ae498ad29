"""A linear regression trained in one process: deterministic, learnable, averaged correctly.

python train_single.py --epochs 5 --batch-size 64 --out work/single
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SimpleModel(nn.Module):
    """One linear layer: 10 inputs, 1 output."""

    def __init__(self, input_dim=10, output_dim=1):
        super().__init__()
        self.linear = nn.Linear(input_dim, output_dim)

    def forward(self, x):
        return self.linear(x)


def make_data(samples, seed):
    """A regression the model can learn: y = X @ w_true + 0.5 + noise, fixed by the seed."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(samples, 10, generator=g)
    w_true = torch.randn(10, 1, generator=g)
    y = X @ w_true + 0.5 + 0.1 * torch.randn(samples, 1, generator=g)
    return {"X": X, "y": y}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train a linear regression in one process.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic data set")
    parser.add_argument("--seed", type=int, default=0, help="fixes the data, the shuffle and the init")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, required=True, help="folder for data.pt, final.pt, metrics.json")
    return parser.parse_args(argv)


def make_loader(args):
    """Write the data set once (a real job downloads it here), then read it back from disk."""
    args.out.mkdir(parents=True, exist_ok=True)
    data_file = args.out / "data.pt"
    torch.save(make_data(args.samples, args.seed), data_file)
    data = torch.load(data_file, weights_only=True)
    dataset = TensorDataset(data["X"], data["y"])
    shuffle = torch.Generator().manual_seed(args.seed)
    return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=shuffle)


def make_model(args, device):
    # The same initial weights on every run.
    torch.manual_seed(args.seed)
    model = SimpleModel().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, optimizer


def train_epoch(model, loader, optimizer, device):
    """One pass over the loader; returns the mean loss of its batches, as a tensor."""
    # A tensor, not a float: no .item(), so no wait for the GPU at every step.
    running_loss = torch.zeros((), device=device)
    for X, y in loader:
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        # MSE on a real target: there is something to learn.
        loss = F.mse_loss(model(X), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()
    # Divided by the number of batches, not by the index of the last one (M10).
    return running_loss / len(loader)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = make_loader(args)
    model, optimizer = make_model(args, device)
    losses = []
    for epoch in range(args.epochs):
        losses.append(train_epoch(model, loader, optimizer, device).item())
        sys.stdout.write(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}\n")
    torch.save(model.state_dict(), args.out / "final.pt")
    (args.out / "metrics.json").write_text(json.dumps({"loss": losses}, indent=1))
    sys.stdout.write(f"wrote {args.out / 'final.pt'} and metrics.json\n")


if __name__ == "__main__":
    main()
