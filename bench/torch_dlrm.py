"""dlrm-small trained by PyTorch in one process: the baseline of Parasol's training benchmark.

Same model as Parasol's dlrm-small (bottom 13-64-16, one 16-dim embedding per categorical field
from one shared table, pairwise dots of the 27 vectors, top 367-64-1, ReLU, Glorot weights,
zero biases, embeddings uniform(-0.05, 0.05); Adagrad lr 0.05 on the embeddings, Adam lr 1e-3 on
the rest), same Criteo TSV file, same batch. The file is parsed and every categorical value
given an embedding row before the clock starts; only the training loop is timed.

    python3 bench/torch_dlrm.py FILE [--batch 1024] [--threads 2]
Prints: samples_per_second N
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
    def __init__(self, rows, dim=16):
        super().__init__()
        self.embedding = nn.Embedding(rows, dim, sparse=True)
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        self.bottom = mlp([13, 64, dim], last_relu=True)
        vectors = 27
        self.top = mlp([dim + vectors * (vectors - 1) // 2, 64, 1], last_relu=False)
        self.pairs = torch.tril_indices(vectors, vectors, offset=-1)

    def forward(self, dense, cats):
        z = self.bottom(dense)
        t = torch.cat([z.unsqueeze(1), self.embedding(cats)], dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dense, cats, labels, rows = read_criteo(a.file)
    model = Dlrm(rows)
    sparse_opt = torch.optim.Adagrad([model.embedding.weight], lr=0.05, eps=1e-8)
    dense_params = [q for n, q in model.named_parameters() if not n.startswith("embedding")]
    dense_opt = torch.optim.Adam(dense_params, lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    n = labels.shape[0]
    start = time.perf_counter()
    for b in range(0, n, a.batch):
        logits = model(dense[b:b + a.batch], cats[b:b + a.batch])
        loss = loss_fn(logits, labels[b:b + a.batch])
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    seconds = time.perf_counter() - start
    print(f"samples_per_second {n / seconds:.1f}")
    print(f"final_loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
