"""examples/torch_dlrm.py through `parasol launch`: 2 shards, 2 Python workers, on generated
data; it trains (AUC > 0.70) and lands within 0.005 AUC of the C++ worker on the same job."""
import json
import os
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from conftest import run, write_manifest  # noqa: E402

EXAMPLE = os.path.join(os.environ.get("PARASOL_SOURCE_DIR", ""), "examples", "torch_dlrm.py")


def job(tmp_path, train, eval_file, command):
    body = textwrap.dedent(f"""\
        training: {{consistency: bsp, batch_size: 256}}
        model:
          kind: dlrm
          sparse_optimizer: {{kind: adagrad, lr: 0.05, eps: 1e-8}}
          dense_optimizer: {{kind: adam, lr: 0.001}}
        data: {{train: {train}, eval: {eval_file}}}
        """)
    if command:
        body += f"worker:\n  command: [{sys.executable}, {EXAMPLE}]\n"
    folder = tmp_path / ("python" if command else "cpp")
    folder.mkdir()
    return write_manifest(folder, body, servers=2, workers=2)


def launch(binary, manifest, summary):
    status, out = run([binary, "launch", manifest, "--summary", summary], timeout=400)
    assert status == 0, out
    with open(summary) as f:
        return json.load(f), out


def test_the_example_trains_like_the_cpp_worker(tmp_path, binary):
    train, eval_file = str(tmp_path / "train.tsv"), str(tmp_path / "eval.tsv")
    for rows, seed, path in ((100000, 1, train), (10000, 2, eval_file)):
        status, out = run([binary, "gen-data", "--rows", str(rows), "--seed", str(seed),
                           "--out", path])
        assert status == 0, out
    py, out = launch(binary, job(tmp_path, train, eval_file, True), str(tmp_path / "py.json"))
    cpp, _ = launch(binary, job(tmp_path, train, eval_file, False), str(tmp_path / "cpp.json"))
    print(f"python: AUC {py['eval_auc']:.4f}, logloss {py['eval_logloss']:.4f}, "
          f"{py['samples_per_second']:.0f} samples/s; c++: AUC {cpp['eval_auc']:.4f}, "
          f"logloss {cpp['eval_logloss']:.4f}, {cpp['samples_per_second']:.0f} samples/s")
    # Every row trained once across the two Python workers, and evaluated on all of eval.
    assert py["train_samples"] == 100000, py
    assert sorted(w["worker"] for w in py["workers"]) == [0, 1]
    assert py["eval_samples"] == 10000, py
    assert "eval over 10000 samples" in out
    assert py["eval_auc"] > 0.70, py
    assert abs(py["eval_auc"] - cpp["eval_auc"]) < 0.005, (py, cpp)
