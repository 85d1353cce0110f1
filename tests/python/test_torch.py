"""parasol.torch against plain PyTorch: the same outputs, gradients and updates."""
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import parasol  # noqa: E402
import parasol.torch as ptorch  # noqa: E402
from conftest import write_manifest  # noqa: E402

# Keys anywhere in the 64-bit space, some repeated within and across bags.
UNIVERSE = np.array([10, 2**40 + 3, 7, 2**63 + 5, 99, 123456789, 4, 8], dtype=np.uint64)


def manifest(tmp_path, optimizer):
    body = textwrap.dedent(f"""\
        training: {{consistency: bsp}}
        tables:
          - name: emb
            dim: 4
            init: {{kind: uniform, scale: 0.5}}
            optimizer: {optimizer}
        """)
    return parasol.load_manifest(write_manifest(tmp_path, body, servers=2))


def reference(client, mode, optimizer):
    """nn.EmbeddingBag holding the shards' initial rows of UNIVERSE, and its optimizer."""
    with parasol.Client(client.manifest, parasol.Client.OBSERVER) as o:
        rows = o.pull_sparse("emb", UNIVERSE, read_only=True)
    bag = nn.EmbeddingBag(len(UNIVERSE), 4, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(rows))
    if optimizer.startswith("{kind: sgd"):
        opt = torch.optim.SGD(bag.parameters(), lr=0.1)
    else:
        opt = torch.optim.Adagrad(bag.parameters(), lr=0.1, eps=1e-8)
    return bag, opt


def positions(keys):
    index = {int(k): i for i, k in enumerate(UNIVERSE)}
    return torch.tensor([index[int(k)] for k in np.asarray(keys).reshape(-1)],
                        dtype=torch.int64).view(np.shape(keys))


OPTIMIZERS = ["{kind: sgd, lr: 0.1}", "{kind: adagrad, lr: 0.1, eps: 1e-8}"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bags_match_nn_embedding_bag(tmp_path, optimizer, mode):
    m = manifest(tmp_path, optimizer)
    rng = np.random.default_rng(7)
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        ours = ptorch.ShardedEmbeddingBag(c, "emb", mode=mode)
        bag, opt = reference(c, mode, optimizer)
        initial = bag.weight.detach().numpy().copy()
        for step in range(4):
            lengths = rng.integers(1, 5, size=3)
            keys = rng.choice(UNIVERSE, size=int(lengths.sum()))
            offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
            weights = (torch.from_numpy(rng.random(len(keys)).astype(np.float32))
                       if mode == "sum" else None)
            target = torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32))
            out = ours(keys, offsets, per_sample_weights=weights)
            want = bag(positions(keys), offsets, per_sample_weights=weights)
            np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), atol=1e-5)
            ((out * target).sum() + (out ** 2).sum()).backward()
            opt.zero_grad()
            ((want * target).sum() + (want ** 2).sum()).backward()
            opt.step()
            ours.step()
            assert c.clock == step + 1
        rows = c.pull_sparse("emb", UNIVERSE)
        np.testing.assert_allclose(rows, bag.weight.detach().numpy(), atol=1e-5)
        # Training moved the rows (the comparison is not of two untouched tables).
        assert np.abs(rows - initial).max() > 0.05
        c.leave()


def test_embedding_2d_input_eval_mode_and_prefetch_under_ssp(tmp_path):
    body = textwrap.dedent("""\
        training: {consistency: ssp, staleness: 1}
        tables:
          - name: emb
            dim: 4
            optimizer: {kind: sgd, lr: 0.1}
        """)
    m = parasol.load_manifest(write_manifest(tmp_path, body, servers=1))
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        emb = ptorch.ShardedEmbedding(c, "emb")
        keys = np.array([[1, 2, 3], [3, 2, 2**50]], dtype=np.uint64)
        rows = c.pull_sparse("emb", np.array([1, 2, 3, 2**50], dtype=np.uint64), read_only=True)
        emb.eval()
        out = emb(keys)
        assert tuple(out.shape) == (2, 3, 4)
        np.testing.assert_array_equal(out[1, 2].numpy(), rows[3])
        assert c.stats()[0]["tables"][0]["rows"] == 0  # eval pulls create no rows
        emb.train()
        out = emb(torch.from_numpy(keys.astype(np.int64)))
        out.sum().backward()
        emb.flush()  # the push, acknowledged (SSP applies it on arrival)
        assert emb.prefetch(keys)  # ssp: the next step's rows while this one finishes
        emb.step()
        after = emb(keys)  # answered by the prefetched pull
        assert emb._pulls == []
        # d(sum)/d(row) is the number of times the key appears: 2 twice, 1 once.
        np.testing.assert_allclose(rows[1] - after[0, 1].detach().numpy(), 0.1 * 2, atol=1e-6)
        np.testing.assert_allclose(rows[0] - after[0, 0].detach().numpy(), 0.1, atol=1e-6)
        c.leave()


def test_dense_tables_helper(tmp_path):
    body = textwrap.dedent("""\
        tables:
          - name: lin.weight
            kind: dense
            shape: [3, 5]
            optimizer: {kind: sgd, lr: 0.5}
          - name: lin.bias
            kind: dense
            shape: [3]
            init: {kind: zeros}
            optimizer: {kind: sgd, lr: 0.5}
        """)
    m = parasol.load_manifest(write_manifest(tmp_path, body, servers=2))
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        lin = nn.Linear(5, 3)
        tables = ptorch.DenseTables(c, {lin.weight: "lin.weight", lin.bias: "lin.bias"})
        tables.pull()
        w0 = lin.weight.detach().clone()
        np.testing.assert_array_equal(w0.numpy(), c.pull_dense("lin.weight"))
        x = torch.ones(2, 5)
        lin(x).sum().backward()
        tables.push()
        ptorch.step(tables)
        tables.pull()
        np.testing.assert_allclose(lin.weight.detach().numpy(), w0.numpy() - 0.5 * 2, atol=1e-6)
        np.testing.assert_allclose(lin.bias.detach().numpy(), np.full(3, -1.0), atol=1e-6)
        with pytest.raises(parasol.Error, match="shape"):
            ptorch.DenseTables(c, {nn.Linear(4, 3).weight: "lin.weight"})
        c.leave()


@pytest.mark.parametrize("consistency", ["bsp", "asp"])
def test_a_module_used_twice_in_a_step_pushes_once(tmp_path, consistency):
    """Two forwards (and a backward with retain_graph twice) in one step: the gradients are
    summed into one update, as nn.EmbeddingBag with one optimizer step (under ASP two pushes
    would be two Adagrad steps)."""
    body = textwrap.dedent(f"""\
        training: {{consistency: {consistency}}}
        tables:
          - name: emb
            dim: 4
            init: {{kind: uniform, scale: 0.5}}
            optimizer: {{kind: adagrad, lr: 0.1, eps: 1e-8}}
        """)
    m = parasol.load_manifest(write_manifest(tmp_path, body, servers=2))
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        ours = ptorch.ShardedEmbeddingBag(c, "emb", mode="sum")
        bag, opt = reference(c, "sum", "adagrad")
        a = np.array([[10, 7], [99, 10]], dtype=np.uint64)
        b = np.array([[7, 4]], dtype=np.uint64)
        loss = ours(a).pow(2).sum() + 3 * ours(b).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        ref = bag(positions(a)).pow(2).sum() + 3 * bag(positions(b)).sum()
        opt.zero_grad()
        ref.backward(retain_graph=True)
        ref.backward()
        opt.step()
        ours.step()
        np.testing.assert_allclose(c.pull_sparse("emb", UNIVERSE), bag.weight.detach().numpy(),
                                   atol=1e-5)
        c.leave()


def test_float_keys_are_refused(tmp_path):
    m = manifest(tmp_path, OPTIMIZERS[0])
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        emb = ptorch.ShardedEmbedding(c, "emb")
        with pytest.raises(TypeError, match="keys: expected integers"):
            emb(np.array([1.9, 2.2]))
        with pytest.raises(TypeError, match="keys: expected integers, got an array of dtype float64"):
            c.pull_sparse("emb", np.array([1.9, 2.2]))
        c.leave()
