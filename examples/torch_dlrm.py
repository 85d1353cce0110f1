"""dlrm-small written in PyTorch, its tables on Parasol's servers.

The embedding table (model.embeddings) and the dense layers (model.bottom.*, model.top.*) live on
the shards, which apply the manifest's optimizers (Adagrad and Adam), exactly as for Parasol's
own C++ worker; this process computes the model in PyTorch. `parasol launch` starts it once per
worker (worker.command in examples/torch-dlrm.yaml):

    parasol launch examples/torch-dlrm.yaml --summary summary.json

or by hand, with the servers already running:

    PARASOL_MANIFEST=examples/torch-dlrm.yaml PARASOL_WORKER=0 python3 examples/torch_dlrm.py

Prints a progress line now and then and, on worker 0, the eval logloss and AUC.
"""
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import parasol
import parasol.torch as ptorch


class Dlrm(nn.Module):
    """Bottom MLP (ReLU on every layer), one embedding per categorical field from one shared
    table, the pairwise dots of the 27 vectors, top MLP (ReLU but on the last layer)."""

    def __init__(self, client, layout):
        super().__init__()
        self.embedding = ptorch.ShardedEmbedding(client, "model.embeddings")
        dim = layout["embedding_dim"]
        widths = [parasol.criteo_dense_features] + list(layout["bottom"])
        self.bottom = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        vectors = parasol.criteo_sparse_fields + 1
        widths = [dim + vectors * (vectors - 1) // 2] + list(layout["top"])
        self.top = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.register_buffer("pairs", torch.tril_indices(vectors, vectors, offset=-1),
                             persistent=False)

    def tables(self):
        """Each dense parameter and the table the C++ worker keeps it in."""
        mapping = {}
        for prefix, layers in (("model.bottom", self.bottom), ("model.top", self.top)):
            for i, layer in enumerate(layers):
                mapping[layer.weight] = f"{prefix}.{i}.weight"
                mapping[layer.bias] = f"{prefix}.{i}.bias"
        return mapping

    def forward(self, dense, keys):
        z = dense
        for layer in self.bottom:
            z = torch.relu(layer(z))
        e = self.embedding(keys)  # (batch, 26, dim)
        t = torch.cat([z.unsqueeze(1), e], dim=1)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        h = torch.cat([z, dots], dim=1)
        for i, layer in enumerate(self.top):
            h = layer(h)
            if i + 1 < len(self.top):
                h = torch.relu(h)
        return h.squeeze(1)


def batch_tensors(batch):
    dense = torch.from_numpy(batch["dense"])
    keys = batch["keys"].reshape(batch["size"], parasol.criteo_sparse_fields)
    return dense, keys, torch.from_numpy(batch["labels"])


def evaluate(model, dense_tables, manifest):
    model.eval()
    dense_tables.pull()
    probs, labels = [], []
    reader = parasol.BatchReader([manifest.eval_file], manifest.batch_size,
                                 format=manifest.data_format)
    with torch.no_grad():
        for batch in reader:
            dense, keys, y = batch_tensors(batch)
            probs.append(torch.sigmoid(model(dense, keys)).numpy())
            labels.append(y.numpy())
    model.train()
    p, y = np.concatenate(probs), np.concatenate(labels)
    return len(p), parasol.log_loss(p, y), parasol.auc(p, y)


def main():
    path, rank, summary, key_path = parasol.worker_environment()
    manifest = parasol.load_manifest(path)
    if manifest.model["kind"] != "dlrm":
        sys.exit(f"{path}: this example trains model.kind dlrm, got {manifest.model['kind']}")
    torch.set_num_threads(int(os.environ.get("PARASOL_TORCH_THREADS", "1")))
    torch.manual_seed(manifest.seed + rank)
    client = parasol.Client(manifest, rank, key_path)
    model = Dlrm(client, manifest.model)
    dense_tables = ptorch.DenseTables(client, model.tables())
    loss_fn = nn.BCEWithLogitsLoss()

    client.barrier(0)
    reader = parasol.reader_for(manifest, rank)
    start = last_line = time.perf_counter()
    steps = samples = 0
    recent = []
    for batch in reader:
        if manifest.max_steps and steps >= manifest.max_steps:
            break
        dense, keys, labels = batch_tensors(batch)
        # The step's pulls (dense layers and the batch's rows) in one message per shard.
        with client.step_messages():
            dense_tables.pull_async()
            model.embedding.pull_async(keys)
        dense_tables.pull()
        loss = loss_fn(model(dense, keys), labels)
        loss.backward()
        # The rows' and the layers' gradients to the shards (one message per shard), then the
        # end of this worker's clock.
        ptorch.step(model.embedding, dense_tables)
        steps += 1
        samples += batch["size"]
        recent = (recent + [loss.item()])[-100:]
        now = time.perf_counter()
        if now - last_line > 2.0:
            print(f"worker {rank}: step {steps}, {samples / (now - start):.0f} samples/s, "
                  f"train loss {sum(recent) / len(recent):.4f}", flush=True)
            last_line = now
    seconds = time.perf_counter() - start
    client.leave()
    client.barrier(1)
    result = {"worker": rank, "steps": steps, "train_samples": samples,
              "train_seconds": seconds, "samples_per_second": samples / seconds if seconds else 0,
              "last_loss": sum(recent) / len(recent) if recent else 0,
              "bad_rows": reader.bad_rows}
    line = (f"worker {rank}: {steps} steps, {samples} samples in {seconds:.1f} s "
            f"({result['samples_per_second']:.0f} samples/s), train loss {result['last_loss']:.4f}")
    if rank == 0 and manifest.eval_file:
        n, logloss, auc = evaluate(model, dense_tables, manifest)
        result.update(evaluated=True, eval_samples=n, eval_logloss=logloss, eval_auc=auc)
        line += f"; eval over {n} samples: logloss {logloss:.4f}, AUC {auc:.4f}"
    print(line, flush=True)
    parasol.write_summary(summary, **result)
    client.close()


if __name__ == "__main__":
    main()
