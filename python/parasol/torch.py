"""PyTorch modules whose parameters live on Parasol's servers (README, "From Python").

ShardedEmbeddingBag / ShardedEmbedding: the table stays on the shards. forward() pulls the
batch's distinct rows (one request per shard; rows prefetched with prefetch() are used when
they are the batch's), and backward pushes their gradients; the shards' optimizer (the table's
`optimizer` in the manifest) applies them. step(...) waits for the pushes and ends the
worker's clock.

Dense parameters either stay in PyTorch with its own optimizer, or live on dense tables:
DenseTables(client, {parameter: table name}) pulls them before forward and pushes their
gradients after backward.
"""

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from . import Error


def _unique(indices):
    """Distinct keys of `indices` (any integer array or tensor) and each key's position."""
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    flat = np.ascontiguousarray(indices, dtype=np.uint64).reshape(-1)
    unique, inverse = np.unique(flat, return_inverse=True)
    return flat, unique, inverse


class _Pull:
    """A pull in flight: the keys it was for and its ticket."""

    def __init__(self, client, table, flat, unique, inverse, prefetch, read_only):
        self.flat = flat
        self.unique = unique
        self.inverse = inverse
        self.ticket = client.pull_sparse_async(table, unique, prefetch=prefetch,
                                               read_only=read_only)

    def matches(self, flat):
        return self.flat.shape == flat.shape and np.array_equal(self.flat, flat)


class ShardedEmbeddingBag(nn.Module):
    """nn.EmbeddingBag over a sparse table of the job: keys are uint64 ids (any value).

    forward(input, offsets=None, per_sample_weights=None) as nn.EmbeddingBag: a 2-D input is
    one bag per row; a 1-D input is cut into bags at `offsets`. mode: "sum", "mean" or "max".
    In eval mode (module.eval()) and under torch.no_grad() the pulls create no rows and nothing
    is pushed. `device` (e.g. "cuda"): where the rows go for the computation (they travel
    through host memory).
    """

    def __init__(self, client, table, mode="mean", device=None):
        super().__init__()
        self.device = torch.device(device) if device is not None else None
        if mode not in ("sum", "mean", "max", None):
            raise ValueError(f"mode must be sum, mean or max, got {mode!r}")
        self.client = client
        self.table = client.table_id(table)
        info = client_table(client, self.table)
        if info.kind != "sparse":
            raise Error(f"table '{info.name}' is dense: ShardedEmbeddingBag needs a sparse table")
        self.table_name = info.name
        self.embedding_dim = info.dim
        self.mode = mode
        self._pending = []   # push tickets of this step
        self._pulls = []     # pulls issued ahead (prefetch(), pull_async())

    def pull_async(self, indices, prefetch=False):
        """Issues the pull of `indices`' rows now (e.g. inside client.step_messages(), so every
        pull of the step travels in one message per shard); forward() on the same indices uses
        it. With prefetch=True the pull is for the next step (SSP/ASP: it carries the clock its
        rows will be used at)."""
        flat, unique, inverse = _unique(indices)
        read_only = not (self.training and torch.is_grad_enabled())
        self._pulls.append(_Pull(self.client, self.table, flat, unique, inverse, prefetch,
                                 read_only))
        if len(self._pulls) > 4:
            # Unused pulls are completed and dropped: the client keeps their arrays until then.
            self.client.wait(self._pulls.pop(0).ticket)

    def prefetch(self, indices):
        """Pulls the next batch's rows while this one computes (SSP/ASP; under BSP the rows of
        the next clock are not readable before this worker ticks, so it returns False and
        forward() pulls them)."""
        if self.client_consistency() == "bsp":
            return False
        self.pull_async(indices, prefetch=True)
        return True

    def client_consistency(self):
        return self.client.manifest.consistency

    def _rows(self, indices):
        flat, unique, inverse = _unique(indices)
        pull = None
        for i, p in enumerate(self._pulls):
            if p.matches(flat):
                pull = self._pulls.pop(i)
                break
        if pull is None:
            read_only = not (self.training and torch.is_grad_enabled())
            pull = _Pull(self.client, self.table, flat, unique, inverse, False, read_only)
        rows = torch.from_numpy(self.client.wait(pull.ticket))
        if self.device is not None:
            rows = rows.to(self.device)
        return pull.unique, pull.inverse, rows

    def _gather(self, rows, inverse, indices, offsets, per_sample_weights):
        idx = torch.from_numpy(inverse.astype(np.int64)).to(rows.device)
        if isinstance(indices, torch.Tensor):
            shape = tuple(indices.shape)
        else:
            shape = np.shape(indices)
        if len(shape) == 2:
            idx = idx.view(shape)
            offsets = None
        elif offsets is None:
            raise ValueError("a 1-D input needs offsets")
        elif not isinstance(offsets, torch.Tensor):
            offsets = torch.as_tensor(np.asarray(offsets, dtype=np.int64))
        if offsets is not None:
            offsets = offsets.to(rows.device)
        return F.embedding_bag(idx, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)

    def forward(self, input, offsets=None, per_sample_weights=None):
        unique, inverse, rows = self._rows(input)
        train = self.training and torch.is_grad_enabled()
        if train:
            rows.requires_grad_(True)
            keys = unique

            def push(grad):
                g = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
                self._pending.append(self.client.push_sparse_async(self.table, keys, g))

            rows.register_hook(push)
        return self._gather(rows, inverse, input, offsets, per_sample_weights)

    def flush(self):
        """Waits until the shards have acknowledged this module's pushes."""
        pending, self._pending = self._pending, []
        for t in pending:
            self.client.wait(t)

    def step(self):
        """flush(), then ends the worker's clock (use parasol.torch.step(...) when several
        modules share the client)."""
        step(self)

    def extra_repr(self):
        return f"table={self.table_name!r}, dim={self.embedding_dim}, mode={self.mode!r}"


class ShardedEmbedding(ShardedEmbeddingBag):
    """nn.Embedding over a sparse table: forward(indices) has shape indices.shape + (dim,)."""

    def __init__(self, client, table, device=None):
        super().__init__(client, table, mode=None, device=device)

    def _gather(self, rows, inverse, indices, offsets, per_sample_weights):
        shape = tuple(indices.shape) if isinstance(indices, torch.Tensor) else np.shape(indices)
        idx = torch.from_numpy(inverse.astype(np.int64)).view(shape).to(rows.device)
        return F.embedding(idx, rows)


class DenseTables:
    """PyTorch parameters kept on the job's dense tables (the shards' optimizer updates them).

    DenseTables(client, {parameter: "table name"}); pull() before forward writes the shards'
    values into the parameters; push() after backward sends their .grad; flush() waits for the
    pushes. Shapes must equal the tables' shapes.
    """

    def __init__(self, client, mapping):
        self.client = client
        self.entries = []
        for param, table in mapping.items():
            tid = client.table_id(table)
            info = client_table(client, tid)
            if info.kind != "dense":
                raise Error(f"table '{info.name}' is sparse: DenseTables needs dense tables")
            if tuple(info.shape) != tuple(param.shape):
                raise Error(f"table '{info.name}' has shape {tuple(info.shape)}, the parameter "
                            f"{tuple(param.shape)}")
            buf = np.empty(tuple(info.shape), dtype=np.float32)
            self.entries.append((param, tid, buf))
        self._pending = []
        self._pulls = []

    def pull_async(self):
        """Issues the pulls (e.g. inside client.step_messages()); pull() completes them."""
        self._pulls = [self.client.pull_dense_async(tid, out=buf) for _, tid, buf in self.entries]

    def pull(self):
        if not self._pulls:
            self.pull_async()
        pulls, self._pulls = self._pulls, []
        for t in pulls:
            self.client.wait(t)
        with torch.no_grad():
            for param, _, buf in self.entries:
                param.copy_(torch.from_numpy(buf))

    def push(self):
        for param, tid, _ in self.entries:
            g = param.grad
            grad = (np.zeros(tuple(param.shape), dtype=np.float32) if g is None else
                    np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32))
            self._pending.append(self.client.push_dense_async(tid, grad))
            param.grad = None

    def flush(self):
        pending, self._pending = self._pending, []
        for t in pending:
            self.client.wait(t)


def client_table(client, table_id):
    return client.manifest.tables[table_id]


def step(*parts):
    """Waits for the pushes of every module (ShardedEmbeddingBag, DenseTables) given, then ends
    the worker's clock once. All parts must share one client."""
    clients = {id(p.client): p.client for p in parts}
    if len(clients) != 1:
        raise Error("parasol.torch.step: the parts must share one client")
    for p in parts:
        p.flush()
    next(iter(clients.values())).tick()
