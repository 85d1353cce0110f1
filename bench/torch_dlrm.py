"""dlrm-small trained by PyTorch in one process: the baseline of Parasol's training benchmark.

Same model as Parasol's dlrm-small (bottom 13-64-16, one 16-dim embedding per categorical field
from one shared table, pairwise dots of the 27 vectors, top 367-64-1, ReLU, Glorot weights,
zero biases, embeddings uniform(-0.05, 0.05); Adagrad lr 0.05 on the embeddings, Adam lr 1e-3 on
the rest), same Criteo TSV file, same batch.

Tuned as a PyTorch user would:
- the 26 lookups are one `EmbeddingBag` call (one row per bag, sparse gradients);
- gradients are set to None rather than zero-filled between steps;
- the interaction computes only the lower triangle's 351 dots (each pair's product summed), or
  the full 27 x 27 `bmm` with half thrown away, whichever ran faster on this machine in the
  warm-up (`--interaction auto`, the default; the choice is printed);
- the file is parsed and every categorical value given an embedding row before the clock
  starts, and `--warmup` steps (20) run before it too; Parasol's figure against it is its
  worker's rate after as many steps (`samples_per_second_after_warmup`).

    python3 bench/torch_dlrm.py FILE [--batch 1024] [--threads 2] [--warmup 20]
                                     [--interaction auto|tril|bmm]
Prints: interaction NAME, samples_per_second N, final_loss L
"""
import argparse
import math
import time

import torch
from torch import nn


def read_criteo(path):
    ids = {}
    dense, cats, labels = [], [], []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 40:
                continue
            labels.append(float(fields[0]))
            dense.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1:14]])
            row = []
            for i, v in enumerate(fields[14:]):
                row.append(ids.setdefault((i, v), len(ids)))
            cats.append(row)
    return (torch.tensor(dense), torch.tensor(cats), torch.tensor(labels), len(ids))


def mlp(widths, last_relu):
    layers = []
    for i in range(len(widths) - 1):
        linear = nn.Linear(widths[i], widths[i + 1])
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if i < len(widths) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Dlrm(nn.Module):
    def __init__(self, rows, dim=16, interaction="tril"):
        super().__init__()
        self.dim = dim
        self.embedding = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        self.bottom = mlp([13, 64, dim], last_relu=True)
        vectors = 27
        self.top = mlp([dim + vectors * (vectors - 1) // 2, 64, 1], last_relu=False)
        self.pairs = torch.tril_indices(vectors, vectors, offset=-1)
        self.interaction = interaction
        self.offsets = torch.empty(0, dtype=torch.long)

    def forward(self, dense, cats):
        z = self.bottom(dense)
        flat = cats.reshape(-1)
        if self.offsets.numel() != flat.numel():
            self.offsets = torch.arange(flat.numel(), dtype=torch.long)
        e = self.embedding(flat, self.offsets).view(cats.shape[0], cats.shape[1], self.dim)
        t = torch.cat([z.unsqueeze(1), e], dim=1)
        if self.interaction == "tril":
            dots = (t[:, self.pairs[0]] * t[:, self.pairs[1]]).sum(dim=2)
        else:
            dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)


def train(model, dense, cats, labels, batch, steps=None):
    """Trains over the batches (the first `steps` of them, if given); returns the last loss."""
    sparse_opt = model.sparse_opt
    dense_opt = model.dense_opt
    loss_fn = nn.BCEWithLogitsLoss()
    n = labels.shape[0]
    loss = None
    for i, b in enumerate(range(0, n, batch)):
        if steps is not None and i >= steps:
            break
        logits = model(dense[b:b + batch], cats[b:b + batch])
        loss = loss_fn(logits, labels[b:b + batch])
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    return loss


def build(rows, interaction):
    torch.manual_seed(0)
    model = Dlrm(rows, interaction=interaction)
    model.sparse_opt = torch.optim.Adagrad([model.embedding.weight], lr=0.05, eps=1e-8)
    dense_params = [q for n, q in model.named_parameters() if not n.startswith("embedding")]
    model.dense_opt = torch.optim.Adam(dense_params, lr=1e-3)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--interaction", choices=["auto", "tril", "bmm"], default="auto")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dense, cats, labels, rows = read_criteo(a.file)
    interaction = a.interaction
    if interaction == "auto":
        # Each way for the warm-up's steps, twice alternated; the faster total is kept.
        spent = {"tril": 0.0, "bmm": 0.0}
        for _ in range(2):
            for way in spent:
                trial = build(rows, way)
                start = time.perf_counter()
                train(trial, dense, cats, labels, a.batch, steps=max(a.warmup, 5))
                spent[way] += time.perf_counter() - start
        interaction = min(spent, key=spent.get)
    print(f"interaction {interaction}")
    model = build(rows, interaction)
    train(model, dense, cats, labels, a.batch, steps=a.warmup)
    n = labels.shape[0]
    start = time.perf_counter()
    loss = train(model, dense, cats, labels, a.batch)
    seconds = time.perf_counter() - start
    print(f"samples_per_second {n / seconds:.1f}")
    print(f"final_loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
