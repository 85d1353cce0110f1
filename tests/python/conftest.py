"""Shared by the Python tests: free ports, manifests in a temporary folder, real shards."""
import os
import socket
import subprocess

import pytest

import parasol


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_manifest(folder, body, servers=2, workers=1):
    """A manifest with `servers` shards on free loopback ports, `workers` workers and `body`
    (more YAML sections) appended. Returns its path."""
    ports = free_ports(servers)
    text = ("cluster:\n  servers: [" + ", ".join(f"127.0.0.1:{p}" for p in ports) + "]\n"
            f"  workers: {workers}\n  connect_timeout: 20s\n  request_timeout: 20s\n" + body)
    path = os.path.join(str(folder), "job.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture
def binary():
    return parasol.find_binary()


def run(argv, timeout=300, **kw):
    """Runs a program to its end (bounded) and returns (exit status, output)."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                       text=True, **kw)
    return p.returncode, p.stdout
