"""A Python worker that fails stops the job with its error; a worker command that cannot run
is named."""
import sys
import textwrap
import time

from conftest import run, write_manifest

FAILING = textwrap.dedent("""\
    import numpy as np
    import parasol
    path, rank, _, _ = parasol.worker_environment()
    m = parasol.load_manifest(path)
    c = parasol.Client(m, rank)
    for step in range(1000):
        c.pull_sparse("emb", np.arange(8, dtype=np.uint64))  # BSP: in step with the other
        c.push_sparse("emb", np.arange(8, dtype=np.uint64), np.ones((8, 4), np.float32))
        c.tick()
        if rank == 1 and step == 3:
            raise ValueError("worker 1 found a bad batch at step 3")
    c.leave()
    """)


def manifest(tmp_path, command):
    body = ("tables:\n  - {name: emb, dim: 4}\n"
            f"worker:\n  command: {command}\n")
    return write_manifest(tmp_path, body, servers=2, workers=2)


def test_an_exception_in_a_worker_stops_the_job(tmp_path, binary):
    (tmp_path / "failing.py").write_text(FAILING)
    path = manifest(tmp_path, f"[{sys.executable}, failing.py]")  # relative: the manifest's folder
    start = time.monotonic()
    status, out = run([binary, "launch", path], timeout=120)
    assert status == 1, out
    assert "ValueError: worker 1 found a bad batch at step 3" in out, out
    assert "launch: the job failed: worker 1 exited with code 1" in out, out
    assert time.monotonic() - start < 60, out


def test_a_worker_command_that_cannot_run_is_named(tmp_path, binary):
    path = manifest(tmp_path, "[./no-such-program, x]")
    status, out = run([binary, "launch", path], timeout=120)
    assert status == 1, out
    assert "worker.command: cannot run './no-such-program'" in out, out
    assert "No such file or directory" in out, out


def test_summaries_of_worker_commands(tmp_path, binary):
    # None written: the job still succeeds (its figures are absent).
    path = manifest(tmp_path, "[/bin/sh, -c, 'exit 0']")
    status, out = run([binary, "launch", path], timeout=120)
    assert status == 0, out
    assert "worker 1 wrote no summary" in out, out
    # One that is not JSON: named, with what it holds.
    path = manifest(tmp_path, "[/bin/sh, -c, 'echo \"{oops\" > \"$PARASOL_SUMMARY\"']")
    status, out = run([binary, "launch", path], timeout=120)
    assert status == 1, out
    assert "worker 0's summary" in out and "is not a JSON object" in out and "{oops" in out, out
    # parasol.write_summary writes NaN as null, which launch reads.
    script = tmp_path / "nan.py"
    script.write_text("import os, parasol\n"
                      "parasol.write_summary(os.environ['PARASOL_SUMMARY'], train_samples=5,"
                      " eval_auc=float('nan'), samples_per_second=2.0)\n")
    path = manifest(tmp_path, f"[{sys.executable}, nan.py]")
    status, out = run([binary, "launch", path], timeout=120)
    assert status == 0, out
    assert "job: 10 samples, 4 samples/s" in out, out
