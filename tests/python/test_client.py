"""The Python client against the C++ client on the same tables, and its errors."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import parasol
from conftest import run, write_manifest

TABLES = textwrap.dedent("""\
    tables:
      - name: emb
        dim: 8
        init: {kind: uniform, scale: 0.1}
        optimizer: {kind: adagrad, lr: 0.05}
      - name: w
        kind: dense
        shape: [37, 5]
        init: {kind: normal, stddev: 0.1}
        optimizer: {kind: adam, lr: 0.01}
    """)


def workload(client, steps):
    """The workload of tests/python/client_probe.cc, through the Python client."""
    dim = client.table("emb").dim
    n = client.table("w").num_elements
    for s in range(steps):
        keys = (np.arange(64, dtype=np.uint64) * 7919 + s * 13) % 1000
        j = np.arange(dim, dtype=np.uint64)
        grads = (((keys[:, None] * 31 + j[None, :] + s) % 17).astype(np.float32)
                 / np.float32(17) - np.float32(0.5))
        e = np.arange(n, dtype=np.uint64)
        dense = ((e + 3 * s) % 11).astype(np.float32) / np.float32(11) - np.float32(0.5)
        t1 = client.push_sparse_async("emb", keys, grads)
        t2 = client.push_dense_async("w", dense.reshape(37, 5))
        client.wait_all([t1, t2])
        client.tick()


def read_all(client):
    rows = client.pull_sparse("emb", np.arange(1000, dtype=np.uint64))
    dense = client.pull_dense("w")
    return rows.tobytes() + dense.tobytes()


def probe(manifest, mode, steps, out):
    status, output = run([os.environ["PARASOL_CLIENT_PROBE"], manifest, mode, str(steps), out])
    assert status == 0, output
    with open(out, "rb") as f:
        return f.read()


def test_same_bytes_as_the_cpp_client(tmp_path):
    path = write_manifest(tmp_path, TABLES)
    m = parasol.load_manifest(path)
    # The C++ client trains; both read the result.
    with parasol.local_servers(m):
        cpp = probe(path, "work", 5, str(tmp_path / "cpp.bin"))
        with parasol.Client(m, parasol.Client.OBSERVER) as c:
            py_read = read_all(c)
    assert len(cpp) == (1000 * 8 + 185) * 4
    assert py_read == cpp
    # The Python client trains a fresh job the same way: the same bytes again.
    with parasol.local_servers(m):
        with parasol.Client(m, 0) as c:
            workload(c, 5)
            py_trained = read_all(c)
            c.leave()
        cpp_read = probe(path, "read", 0, str(tmp_path / "cpp2.bin"))
    assert py_trained == cpp
    assert cpp_read == cpp
    # And the rows did change: not an untrained table read twice.
    with parasol.local_servers(m):
        with parasol.Client(m, parasol.Client.OBSERVER) as c:
            assert read_all(c) != cpp


def test_out_arrays_tickets_and_steps(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1)
    m = parasol.load_manifest(path)
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        keys = np.array([3, 1, 3, 999], dtype=np.int64)  # converted to uint64
        out = np.zeros((4, 8), dtype=np.float32)
        with c.step_messages():
            t = c.pull_sparse_async("emb", keys, out=out)
            d = c.pull_dense_async("w")
        assert c.outstanding == 2
        assert c.wait(t) is out
        assert c.wait(t) is out  # waiting twice returns the same
        assert out[0].tobytes() == out[2].tobytes() and np.any(out != 0)
        assert c.wait(d).shape == (37, 5)
        assert c.outstanding == 0
        # An `out` that would be converted (float64, not contiguous, read-only) is refused.
        for bad in (np.zeros((4, 8)), np.zeros((8, 8), np.float32)[::2], np.zeros(3, np.float32)):
            with pytest.raises(parasol.Error, match="out: expected a writable float32"):
                c.pull_sparse_async("emb", keys, out=bad)
        ro = np.zeros((4, 8), np.float32)
        ro.flags.writeable = False
        with pytest.raises(parasol.Error, match="out"):
            c.pull_sparse_async("emb", keys, out=ro)
        assert c.clock == 0
        c.tick()
        assert c.clock == 1
        stats = c.stats()
        assert len(stats) == 1 and stats[0]["shard"] == 0 and stats[0]["clock"] == 1
        c.leave()


def test_errors_carry_the_cpp_text(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1)
    m = parasol.load_manifest(path)
    with pytest.raises(parasol.Error, match=r"inline:1:1: key 'tabels': unknown key \(did you mean 'tables'\?\)"):
        parasol.parse_manifest("tabels: []\ncluster: {servers: ['127.0.0.1:1']}\n", "inline")
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        keys = np.arange(4, dtype=np.uint64)
        with pytest.raises(parasol.Error, match="no table named 'nope'"):
            c.pull_sparse("nope", keys)
        # Shapes as given and as expected.
        with pytest.raises(parasol.Error, match=re.escape(
                "grads: expected shape (4, 8) for 4 keys of table 'emb' (dim 8), got shape (4, 7)")):
            c.push_sparse("emb", keys, np.zeros((4, 7), np.float32))
        with pytest.raises(parasol.Error, match=re.escape(
                "grads: expected shape (37, 5) for table 'w' (185 floats), got shape (5, 36) "
                "(180 floats)")):
            c.push_dense("w", np.zeros((5, 36), np.float32))
        with pytest.raises(parasol.Error, match=re.escape(
                "out: expected a writable float32 C-contiguous array of shape (4, 8) (32 floats) "
                "for table 'emb', got an array of dtype float32 and shape (4, 7)")):
            c.pull_sparse("emb", keys, out=np.zeros((4, 7), np.float32))
        # Keys from any integer sequence; anything else is a TypeError naming the argument.
        assert np.array_equal(c.pull_sparse("emb", [0, 1, 2, 3]), c.pull_sparse("emb", keys))
        assert np.array_equal(c.pull_sparse("emb", range(4)), c.pull_sparse("emb", keys))
        assert c.pull_sparse("emb", (2**64 - 1,)).shape == (1, 8)
        assert c.pull_sparse("emb", []).shape == (0, 8)
        # Ids NumPy would make floats of, NumPy integers, and negative ids (two's complement).
        assert np.array_equal(c.pull_sparse("emb", [2**63, -1]),
                              c.pull_sparse("emb", np.array([2**63, 2**64 - 1], np.uint64)))
        assert np.array_equal(c.pull_sparse("emb", [np.int64(3), np.uint64(2)]),
                              c.pull_sparse("emb", keys[[3, 2]]))
        for bad, why in (([1.5, 2.0], "keys: element 0 is float, not an integer"),
                         (np.array([1.5]), "keys: expected integers, got an array of dtype float64"),
                         ("1234", "keys: expected a sequence of integers"),
                         (7, "keys: expected a sequence of integers"),
                         ({1, 2}, "keys: expected a sequence of integers (a list, or a NumPy "
                                  "integer array), got set"),
                         ({1: 2}, "got dict"),
                         (iter([1, 2]), "got list_iterator"),
                         ([1, "x"], "keys: element 1 is str, not an integer"),
                         ([1, True], "keys: element 1 is bool, not an integer")):
            with pytest.raises(TypeError, match=re.escape(why)):
                c.pull_sparse("emb", bad)
        with pytest.raises(ValueError, match=re.escape("keys: element 0 (18446744073709551616) "
                                                       "is outside [-2^63, 2^64)")):
            c.pull_sparse("emb", [2**64])
        with pytest.raises(parasol.Error, match="is dense"):
            c.pull_sparse("w", keys)
        with pytest.raises(IndexError):
            c.pull_dense(17)
        # An observer may not push: the shard's refusal comes back as the exception's text.
        with parasol.Client(m, parasol.Client.OBSERVER) as o:
            with pytest.raises(parasol.Error) as e:
                o.push_sparse("emb", keys, np.zeros((4, 8), np.float32))
            assert "push" in str(e.value).lower()
        c.leave()
    with pytest.raises(parasol.Error, match="closed"):
        c.tick()


def test_a_shard_that_cannot_start_is_named(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=2)
    m = parasol.load_manifest(path)
    host, port = m.servers[1].rsplit(":", 1)
    import socket
    blocker = socket.socket()
    blocker.bind((host, int(port)))
    blocker.listen()
    try:
        with pytest.raises(parasol.Error, match="server 1 exited"):
            with parasol.local_servers(m, timeout=20):
                pass
    finally:
        blocker.close()


CTRL_C = textwrap.dedent("""\
    import sys, time
    import numpy as np
    import parasol
    m = parasol.load_manifest(sys.argv[1])
    c = parasol.Client(m, 0)
    c.push_sparse("emb", np.arange(4, dtype=np.uint64), np.ones((4, 8), np.float32))
    c.tick()
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        c.pull_sparse("emb", np.arange(4, dtype=np.uint64))  # held: worker 1 is at clock 0
        print("not held", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - t0:.1f} s", flush=True)
        c.close()
        sys.exit(3)
    """)


def test_ctrl_c_interrupts_a_held_pull_and_the_shards_stay_consistent(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1, workers=2)
    m = parasol.load_manifest(path)
    script = tmp_path / "held.py"
    script.write_text(CTRL_C)
    with parasol.local_servers(m):
        p = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            line = p.stdout.readline()
            assert line.strip() == "waiting", line + p.stdout.read()
            time.sleep(1.0)  # the pull is held now (BSP: the other worker has not ticked)
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 3, out
        assert "interrupted after" in out, out
        waited = float(out.split("interrupted after ")[1].split(" s")[0])
        # The signal came 1 s in and ends the wait at once (the pull itself would wait for the
        # other worker forever, and its request for 20 s).
        assert 0.9 < waited < 5.0, out
        # The push of the interrupted worker was applied once: worker 1 completes the clock
        # and reads it (adagrad with lr 0.05 moves each value by lr * g / sqrt(g^2) = 0.05).
        with parasol.Client(m, parasol.Client.OBSERVER) as o:
            before = o.pull_sparse("emb", np.arange(4, dtype=np.uint64), read_only=True)
        with parasol.Client(m, 1) as c1:
            c1.tick()
            after = c1.pull_sparse("emb", np.arange(4, dtype=np.uint64))
            stats = c1.stats()[0]
        assert stats["errors"] == 0 and stats["bad_messages"] == 0, stats
        np.testing.assert_allclose(before - after, np.full((4, 8), 0.05), rtol=1e-4)


def test_tickets_belong_to_their_client_and_dense_pushes_are_copied(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1, workers=2)
    m = parasol.load_manifest(path)
    with parasol.local_servers(m):
        a = parasol.Client(m, 0)
        b = parasol.Client(m, 1)
        t = a.pull_dense_async("w")
        with pytest.raises(parasol.Error, match="belongs to another client"):
            b.wait(t)
        a.wait(t)
        # The gradient is the array as it was at the call: changing it at once changes nothing.
        before = a.pull_dense("w")
        g = np.ones((37, 5), np.float32)
        t = a.push_dense_async("w", g)
        g[:] = 1000.0
        a.wait(t)
        b.push_dense("w", np.ones((37, 5), np.float32))
        a.tick()
        b.tick()
        after = a.pull_dense("w")
        # Adam's first step moves each weight by lr (0.01) for any gradient of one sign.
        np.testing.assert_allclose(before - after, np.full((37, 5), 0.01), rtol=1e-3)
        # Dropped with requests in flight (a 4 MB pull, a dense push): no crash, nothing left.
        a.pull_sparse_async("emb", np.arange(100000, dtype=np.uint64))
        a.push_dense_async("w", np.ones((37, 5), np.float32))
        assert a.outstanding == 2
        a.close()
        assert a.outstanding == 0
        with pytest.raises(parasol.Error, match="closed"):
            a.pull_dense("w")
        t = b.pull_sparse_async("emb", np.arange(10, dtype=np.uint64))
        del b  # garbage-collected with a ticket outstanding
        import gc
        gc.collect()


SIGNAL_HANDLER = textwrap.dedent("""\
    import signal, sys
    import numpy as np
    import parasol
    m = parasol.load_manifest(sys.argv[1])
    c = parasol.Client(m, 0)
    c.tick()
    def handler(*_):
        c.leave()  # uses the client while it waits in this thread
    signal.signal(signal.SIGTERM, handler)
    print("waiting", flush=True)
    try:
        c.pull_sparse("emb", np.arange(4, dtype=np.uint64))  # held: worker 1 is at clock 0
    except parasol.Error as e:
        print("error:", e, flush=True)
        sys.exit(4)
    """)


def test_a_signal_handler_that_uses_the_waiting_client_gets_an_error(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1, workers=2)
    script = tmp_path / "handler.py"
    script.write_text(SIGNAL_HANDLER)
    with parasol.local_servers(parasol.load_manifest(path)):
        p = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            assert p.stdout.readline().strip() == "waiting"
            time.sleep(0.5)
            p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 4, out
    assert "a signal handler may not use it" in out, out


PUSHER = textwrap.dedent("""\
    import sys
    import numpy as np
    import parasol
    m = parasol.load_manifest(sys.argv[1])
    c = parasol.Client(m, 0)
    keys = np.arange(200000, dtype=np.uint64)
    print("pushing", flush=True)
    try:
        for _ in range(10):
            c.push_sparse("emb", keys, np.ones((len(keys), 8), np.float32))
    except KeyboardInterrupt:
        c.close()
        sys.exit(3)
    print("all pushed", flush=True)
    """)


@pytest.mark.parametrize("seed", range(4))
def test_a_push_interrupted_at_a_random_moment_is_applied_once_or_not_at_all(tmp_path, seed):
    """ASP, SGD: each push moves each row by exactly lr (0.05); a Ctrl-C at a random moment
    (seeded, printed) during ten pushes leaves every row moved a whole number of times lr (at
    most ten), never by a fraction, and every shard's part of a push applied or not."""
    body = TABLES.replace("optimizer: {kind: adagrad, lr: 0.05}", "optimizer: {kind: sgd, lr: 0.05}")
    body = "training: {consistency: asp}\n" + body.replace("init: {kind: uniform, scale: 0.1}",
                                                           "init: {kind: zeros}")
    path = write_manifest(tmp_path, body, servers=2)
    script = tmp_path / "pusher.py"
    script.write_text(PUSHER)
    delay = np.random.default_rng(seed).uniform(0.0, 0.25)
    print(f"seed {seed}: SIGINT {delay:.3f} s after the first push starts")
    m = parasol.load_manifest(path)
    with parasol.local_servers(m):
        p = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            assert p.stdout.readline().strip() == "pushing"
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        # 3: interrupted during a push; 0 or -SIGINT: after all ten.
        assert p.returncode == 3 or "all pushed" in out, (p.returncode, out)
        with parasol.Client(m, parasol.Client.OBSERVER) as o:
            rows = o.pull_sparse("emb", np.arange(200000, dtype=np.uint64), read_only=True)
    moves = -rows / np.float32(0.05)
    assert np.all(np.abs(moves - np.round(moves)) < 1e-3), moves
    assert np.all(rows == rows[:, :1]), "a row moved in part"
    counts = np.round(moves[:, 0]).astype(int)
    assert counts.min() >= 0 and counts.max() <= 10, np.unique(counts)
    print(f"seed {seed}: rows moved {dict(zip(*np.unique(counts, return_counts=True)))} times")
    if p.returncode != 3:
        assert counts.min() == 10


def test_a_script_run_again_against_finished_servers_is_told_what_to_do(tmp_path):
    path = write_manifest(tmp_path, TABLES, servers=1)
    m = parasol.load_manifest(path)
    keys = np.arange(4, dtype=np.uint64)
    with parasol.local_servers(m):
        with parasol.Client(m, 0) as c:
            c.push_sparse("emb", keys, np.ones((4, 8), np.float32))
            c.tick()
            c.leave()
        # The same script again, against the same (long-lived) servers.
        with parasol.Client(m, 0) as c:
            with pytest.raises(parasol.Error) as e:
                c.push_sparse("emb", keys, np.ones((4, 8), np.float32))
    text = str(e.value)
    assert "is over on this shard" in text and "start fresh servers" in text, text
    assert "9223372036854775807" not in text, text
