"""Parasol from Python: a parameter-server client on NumPy arrays (docs/python-api.md).

    import parasol
    manifest = parasol.load_manifest("job.yaml")
    with parasol.local_servers(manifest):            # or servers started by `parasol launch`
        client = parasol.Client(manifest, worker_id=0)
        rows = client.pull_sparse("embeddings", keys)          # (len(keys), dim) float32
        client.push_sparse("embeddings", keys, grads)
        client.tick()                                          # this worker's step is done
        client.leave()

Every call that fails raises parasol.Error (a RuntimeError) carrying the shard's or the
client's message. A Ctrl-C while a call waits raises KeyboardInterrupt at once; the shards stay
consistent (each push is applied once or not at all), and the client can be closed.
`parasol.torch` has the PyTorch modules.
"""

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from ._parasol import (  # noqa: F401  (the public names of the package)
    BatchReader,
    Client as _Client,
    Error,
    Manifest,
    Table,
    Ticket,
    auc,
    criteo_dense_features,
    criteo_sparse_fields,
    load_manifest,
    log_loss,
    parse_manifest,
)
from . import _parasol

__all__ = [
    "BatchReader", "Client", "Error", "Manifest", "Table", "Ticket", "auc", "log_loss",
    "load_manifest", "parse_manifest", "local_servers", "find_binary", "worker_environment",
    "write_summary", "reader_for", "WorkerEnvironment",
]


class Client(_Client):
    """A worker's (or a tool's) connection to every shard of a job.

    Client(manifest, worker_id, key_path="") connects and completes the handshake (the
    manifest must be the servers' own: its fingerprint is checked). worker_id is the worker's
    rank, 0 .. workers-1; tools that only read use Client.OBSERVER.

    Tables are named or numbered (manifest.tables order). The *_async calls return a Ticket;
    wait(ticket) completes it and returns what the call returns. Arrays are float32 and
    C-contiguous where given as `out` (written in place, never copied); keys are converted to
    uint64 when they are not already.
    """

    OBSERVER = 0xFFFFFFFF

    def __init__(self, manifest, worker_id, key_path=""):
        if isinstance(manifest, str):
            manifest = load_manifest(manifest)
        super().__init__(manifest, worker_id, key_path)
        self.manifest = manifest

    def table(self, table):
        """The Table (name, kind, dim, shape, optimizer) of a table name or id."""
        return self.manifest.tables[self.table_id(table)]

    def pull_sparse(self, table, keys, out=None, read_only=False):
        """The rows of `keys`, as a (len(keys), dim) float32 array (or into `out`)."""
        return self.wait(self.pull_sparse_async(table, keys, out=out, read_only=read_only))

    def push_sparse(self, table, keys, grads):
        """Gradient rows for `keys` ((len(keys), dim) floats); repeated keys are summed."""
        self.wait(self.push_sparse_async(table, keys, grads))

    def pull_dense(self, table, out=None):
        """The whole dense tensor, in the table's shape (or into `out`)."""
        return self.wait(self.pull_dense_async(table, out=out))

    def push_dense(self, table, grads):
        """A gradient for the whole dense tensor."""
        self.wait(self.push_dense_async(table, grads))

    @contextlib.contextmanager
    def step_messages(self):
        """Requests made inside travel as one message per shard (a step's pulls, or its
        pushes); each keeps its own ticket."""
        self.begin_step()
        try:
            yield self
        finally:
            self.send_step()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _installed_next_to_package():
    """The `parasol` program of the prefix this package is installed in: a `bin/parasol` in a
    folder above the package's own (PREFIX/lib/python3.X/dist-packages/parasol puts it at
    PREFIX/bin/parasol), the nearest first; None when there is none."""
    folder = os.path.dirname(os.path.abspath(__file__))
    while True:
        up = os.path.dirname(folder)
        if up == folder:
            return None
        folder = up
        candidate = os.path.join(folder, "bin", "parasol")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate


def find_binary(binary=None):
    """The `parasol` program. Tried in order: `binary`; $PARASOL_BIN; for a package imported
    from a build tree, that build's program; for an installed package, the program installed
    with it (a `bin/parasol` in a folder above the package's, as PREFIX/bin/parasol is for
    PREFIX/lib/python3.X/dist-packages/parasol), then the path the build meant to install it
    at; last, `parasol` on PATH. Raises parasol.Error naming every place tried."""
    build, installed = (list(_parasol._binaries) + [None, None])[:2]
    # The build tree's program for the build tree's module; the installed one otherwise.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from_build = os.path.abspath(getattr(_parasol, "_build_python_dir", "")) == here
    tried = []
    candidates = [("the argument", binary), ("$PARASOL_BIN", os.environ.get("PARASOL_BIN"))]
    if from_build:
        candidates.append(("the build tree's", build))
    else:
        candidates.append(("next to the package", _installed_next_to_package()))
        candidates.append(("the install path", installed))
    for what, c in candidates:
        if not c:
            if what == "next to the package":
                tried.append("no bin/parasol above " + os.path.dirname(os.path.abspath(__file__)))
            continue
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
        tried.append(f"{what} {c}")
    found = shutil.which("parasol")
    if found:
        return found
    tried.append("PATH")
    raise Error("cannot find the parasol program (tried: " + "; ".join(tried) +
                "): pass binary=, set PARASOL_BIN or put it on PATH")


def _manifest_path(manifest):
    path = manifest if isinstance(manifest, str) else manifest.source
    if not os.path.isfile(path):
        raise Error(f"local_servers: the manifest must be a file the servers can read, got '{path}'")
    return os.path.abspath(path)


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _since(path, offset):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def local_servers(manifest, binary=None, log_dir=None, timeout=60.0, ranks=None):
    """Starts the manifest's server shards on this machine (`parasol server --rank R`) and stops
    them on exit (SIGTERM: a shard with checkpoint.dir writes its final checkpoint).

    Yields the list of subprocess.Popen objects. Each shard's output goes to
    LOG_DIR/server-R.log (a temporary folder, removed afterwards, when log_dir is None). Raises
    parasol.Error naming the shard and the end of its log when one exits or does not listen
    within `timeout` seconds.
    """
    path = _manifest_path(manifest)
    m = load_manifest(path)
    program = find_binary(binary)
    own_dir = log_dir is None
    logs = tempfile.mkdtemp(prefix="parasol-servers-") if own_dir else log_dir
    os.makedirs(logs, exist_ok=True)
    ranks = list(range(len(m.servers))) if ranks is None else list(ranks)
    procs = []
    starts = {}  # each log's size before its shard started: older lines do not count
    try:
        for r in ranks:
            path_r = os.path.join(logs, f"server-{r}.log")
            starts[r] = os.path.getsize(path_r) if os.path.exists(path_r) else 0
            log = open(path_r, "ab")
            procs.append(subprocess.Popen(
                [program, "server", "--manifest", path, "--rank", str(r)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            log.close()
        # A shard is up when it says so in its log ("shard R/N serving on ..."): a port that
        # accepts connections may belong to another program.
        deadline = time.monotonic() + timeout
        for r, p in zip(ranks, procs):
            log = os.path.join(logs, f"server-{r}.log")
            while f"shard {r}/{len(m.servers)} serving on" not in _since(log, starts[r]):
                if p.poll() is not None:
                    raise Error(f"server {r} exited with status {p.returncode}:\n" + _tail(log))
                if time.monotonic() > deadline:
                    raise Error(f"server {r} is not serving after {timeout} s:\n" + _tail(log))
                time.sleep(0.05)
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if own_dir:
            shutil.rmtree(logs, ignore_errors=True)


WorkerEnvironment = collections.namedtuple("WorkerEnvironment",
                                           ["manifest", "rank", "summary", "key_path"])


def worker_environment():
    """What `parasol worker` (and so `parasol launch`) tells a worker.command program:
    (manifest path, worker rank, summary path or None, CURVE key pair path or "") from
    PARASOL_MANIFEST, PARASOL_WORKER, PARASOL_SUMMARY and PARASOL_KEY."""
    try:
        path = os.environ["PARASOL_MANIFEST"]
        rank = int(os.environ["PARASOL_WORKER"])
    except (KeyError, ValueError) as e:
        raise Error("not started as a Parasol worker: PARASOL_MANIFEST and PARASOL_WORKER "
                    f"must be set ({e})") from None
    return WorkerEnvironment(path, rank, os.environ.get("PARASOL_SUMMARY") or None,
                             os.environ.get("PARASOL_KEY", ""))


def reader_for(manifest, rank):
    """A BatchReader over this worker's share of the manifest's training data."""
    return BatchReader(list(manifest.train_files), manifest.batch_size, epochs=manifest.epochs,
                       rank=rank, workers=manifest.workers, format=manifest.data_format,
                       fail_on_bad_row=manifest.fail_on_bad_row)


def write_summary(path, **fields):
    """Writes a worker's summary where `parasol launch` combines them (train_samples,
    samples_per_second, train_seconds, eval_logloss, eval_auc, eval_samples, bad_rows...)."""
    if not path:
        return

    def finite(v):  # JSON has no NaN or infinity: they are written as null
        if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
            v = v.item()  # NumPy and PyTorch scalars
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(finite(fields), f, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
