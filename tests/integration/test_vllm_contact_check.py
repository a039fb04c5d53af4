"""``benchmarks/vllm_contact.py``, the first-contact check of the vLLM adapter against a server,
run against a sim-server: every check passes there, so that on a real vLLM a WARN or FAIL is
vLLM's difference, not the check's."""

import asyncio

from benchmarks.vllm_contact import run_checks
from tests.integration.sim_server_support import MODEL, sim_server


def test_every_first_contact_check_passes_against_a_sim_server():
    with sim_server(20, "--max-model-len", "4096") as (url, _proc):
        checks = asyncio.run(run_checks(url, wait_s=30, deadline_s=60))
    by_name = {c.name: c for c in checks}
    assert list(by_name) == ["model card", "stream", "metrics", "prefix cache", "too long",
                             "abort", "concurrent"]
    assert {c.name: c.status for c in checks} == dict.fromkeys(by_name, "PASS")
    assert by_name["model card"].detail == f"{MODEL}, max_model_len 4096"
    assert "invalid_request" in by_name["too long"].detail
    assert "maximum context length is 4096" in by_name["too long"].detail
