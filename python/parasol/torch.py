"""PyTorch modules whose parameters live on Parasol's servers (docs/python-api.md).

ShardedEmbeddingBag / ShardedEmbedding: the table stays on the shards. forward() pulls the
batch's distinct rows (one request per shard; rows pulled ahead with pull_async() or
prefetch() are used when they are the batch's, for the same clock), and backward produces
their gradients, which step(...) pushes (one push per table and step, as the C++ worker) and
the shards' optimizer (the table's `optimizer` in the manifest) applies; then it ends the
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
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"keys: expected integers, got dtype {indices.dtype}")
    flat = np.ascontiguousarray(indices).astype(np.uint64, copy=False).reshape(-1)
    unique, inverse = np.unique(flat, return_inverse=True)
    return flat, unique, inverse


class _Pull:
    """A pull in flight: the keys it was for, the clock its rows are for, and its ticket."""

    def __init__(self, client, table, flat, unique, inverse, prefetch, read_only):
        self.flat = flat
        self.unique = unique
        self.inverse = inverse
        self.read_only = read_only
        self.clock = client.clock + (1 if prefetch else 0)
        self.ticket = client.pull_sparse_async(table, unique, prefetch=prefetch,
                                               read_only=read_only)

    def matches(self, flat, clock, read_only):
        return (self.clock == clock and self.read_only == read_only and
                self.flat.shape == flat.shape and np.array_equal(self.flat, flat))


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
        self._grads = []     # (keys, row gradients) of this step's backward passes
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
        self._drop_stale()

    def _drop_stale(self):
        # Pulls no forward can use any more (for an earlier clock), or too many ahead: waited
        # on (the client keeps their arrays until then) and dropped.
        clock = self.client.clock
        keep = []
        for p in self._pulls:
            if p.clock < clock:
                self.client.wait(p.ticket)
            else:
                keep.append(p)
        while len(keep) > 4:
            self.client.wait(keep.pop(0).ticket)
        self._pulls = keep

    def prefetch(self, indices):
        """Pulls the next batch's rows while this one computes (SSP with staleness >= 1, or
        ASP). Under BSP (or SSP with staleness 0) the rows of the next clock cannot be read
        before this worker ticks: it returns False, and forward() pulls them."""
        m = self.client.manifest
        if m.consistency == "bsp" or (m.consistency == "ssp" and m.staleness == 0):
            return False
        self.pull_async(indices, prefetch=True)
        return True

    def _rows(self, indices):
        flat, unique, inverse = _unique(indices)
        read_only = not (self.training and torch.is_grad_enabled())
        self._drop_stale()
        pull = None
        for i, p in enumerate(self._pulls):
            if p.matches(flat, self.client.clock, read_only):
                pull = self._pulls.pop(i)
                break
        if pull is None:
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
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(rows.device)
        return F.embedding_bag(idx, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)

    def forward(self, input, offsets=None, per_sample_weights=None):
        unique, inverse, rows = self._rows(input)
        train = self.training and torch.is_grad_enabled()
        if train:
            rows.requires_grad_(True)
            keys = unique

            def record(grad):
                g = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
                self._grads.append((keys, g))

            rows.register_hook(record)
        return self._gather(rows, inverse, input, offsets, per_sample_weights)

    def send(self):
        """Pushes the row gradients that backward produced since the last step, as one push
        (the gradients of a key used in several forwards or backward passes summed, as
        nn.EmbeddingBag sums them into one update)."""
        grads, self._grads = self._grads, []
        if not grads:
            return
        if len(grads) == 1:
            keys, g = grads[0]
        else:
            keys = np.concatenate([k for k, _ in grads])
            g = np.concatenate([x for _, x in grads])  # the client sums repeated keys
        self._pending.append(self.client.push_sparse_async(self.table, keys, g))

    def flush(self):
        """send(), then waits until the shards have acknowledged this module's pushes."""
        self.send()
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
        """Sends each parameter's .grad (and clears it); a parameter with no gradient is not
        pushed (its optimizer does not step, as with torch.optim)."""
        for param, tid, _ in self.entries:
            g = param.grad
            if g is None:
                continue
            grad = np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)
            self._pending.append(self.client.push_dense_async(tid, grad))
            param.grad = None

    def send(self):
        """push(), for parasol.torch.step() (nothing when push() was called already)."""
        self.push()

    def flush(self):
        pending, self._pending = self._pending, []
        for t in pending:
            self.client.wait(t)


def client_table(client, table_id):
    return client.manifest.tables[table_id]


def step(*parts):
    """Ends the worker's step: sends the row gradients of every ShardedEmbeddingBag given
    (together, one message per shard), waits until the shards have acknowledged every part's
    pushes (DenseTables too), then ends the worker's clock once. All parts share one client."""
    clients = {id(p.client): p.client for p in parts}
    if len(clients) != 1:
        raise Error("parasol.torch.step: the parts must share one client")
    client = next(iter(clients.values()))
    with client.step_messages():
        for p in parts:
            p.send()
    for p in parts:
        p.flush()
    client.tick()
