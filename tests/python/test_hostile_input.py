"""Input the Python module refuses with parasol.Error naming it, promptly: a request larger
than the shards would take, and data files that are not text."""
import textwrap
import time

import numpy as np
import pytest

import parasol
from conftest import write_manifest

TABLES = textwrap.dedent("""\
    server:
      max_request_bytes: 64KiB
    tables:
      - name: emb
        dim: 8
    """)


def test_a_pull_over_the_shards_limit_is_refused_before_it_is_sent(tmp_path):
    m = parasol.load_manifest(write_manifest(tmp_path, TABLES, servers=1))
    keys = np.arange(10**6, dtype=np.uint64)
    with parasol.local_servers(m), parasol.Client(m, 0) as c:
        start = time.monotonic()
        with pytest.raises(parasol.Error) as e:
            c.pull_sparse("emb", keys)
        assert time.monotonic() - start < 5
        text = str(e.value)
        assert ("pull_sparse of 1000000 keys of table 'emb' takes 32000000 bytes (32 a key), "
                "over the limit of 65536 bytes (server.max_request_bytes) on each of its 1 "
                "shards") in text, text
        with pytest.raises(parasol.Error, match="push_sparse of 1000000 keys of table 'emb' "
                                                "takes 40000000 bytes"):
            c.push_sparse("emb", keys, np.zeros((10**6, 8), np.float32))
        # Under the limit the client goes on as before.
        assert c.pull_sparse("emb", keys[:1000]).shape == (1000, 8)
        c.leave()


def test_binary_data_is_a_parasol_error_naming_file_and_line(tmp_path):
    path = tmp_path / "data.svm"
    path.write_bytes(b"1 3:0.5\n\xff\xfe\x80 \xc3\x28:1\n")
    reader = parasol.BatchReader([str(path)], 4, format="libsvm", fail_on_bad_row=True)
    with pytest.raises(parasol.Error) as e:
        list(reader)
    text = str(e.value)
    assert f"malformed row at {path}:2: " in text, text
    assert "\\xff\\xfe\\x80" in text, text
    skipping = parasol.BatchReader([str(path)], 4, format="libsvm")
    assert sum(b["size"] for b in skipping) == 1
    assert skipping.bad_rows == 1
    assert skipping.first_bad_row.startswith(f"{path}:2: "), skipping.first_bad_row
