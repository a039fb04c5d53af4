"""The long-running commands refuse a wrong setup with a clear message and exit status 2: a
namespace whose topics do not exist (not a 40 s timeout and a traceback), and two routers run
under one id (both stop; each would take the other's placements for its own). Real CLI
processes on the real broker."""

import subprocess
import sys
import uuid

import pytest

pytestmark = pytest.mark.integration


def _governor(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "infra.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [["router"], ["controllers"], ["worker", "--slot", "0"],
                                     ["sink", "--no-sql"], ["streams"]])
def test_a_service_on_a_namespace_without_topics_says_how_to_create_them(kafka_bootstrap,
                                                                           command):
    namespace = f"none-{uuid.uuid4().hex[:8]}"
    proc = _governor(*command, "--bootstrap", kafka_bootstrap, "--namespace", namespace)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out[-2000:]
    assert f"of the topics of namespace '{namespace}' do not exist" in " ".join(out.split())
    assert f"governor topics create --namespace {namespace}" in " ".join(out.split())


def test_two_routers_under_one_id_both_exit_saying_why(kafka_bootstrap, catalog):
    args = ("router", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
            "--router-id", "router-0", "--recovery-window-s", "0")
    procs = [_governor(*args), _governor(*args)]
    try:
        outs = [proc.communicate(timeout=90)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 2, out[-2000:]
        assert "2 routers run under the id 'router-0'" in " ".join(out.split())
