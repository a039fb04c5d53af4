"""Building an engine by name: what a worker refuses to start with, and how it says so."""

import re
import shlex

import pytest
from typer.testing import CliRunner

from schemas.config import ModelShape
from schemas.errors import TerminalError
from workers.factory import build_engine
from workers.sim import models

SHAPE = ModelShape(params_b=13.0, n_layers=40, n_heads=40, n_kv_heads=40, head_dim=128,
                   hidden_size=5120, intermediate_size=13824, vocab_size=32000)


def test_a_sim_engine_of_an_unknown_model_says_how_to_declare_one(monkeypatch):
    with pytest.raises(TerminalError, match=r"unknown model 'nosuch-13b'.*config set "
                                            r"models\.NAME '\{\.\.\.\}'") as raised:
        build_engine("sim", model="nosuch-13b")
    # the hint is a command `governor config set` takes (KEY VALUE; before: 'models.NAME={...}',
    # one argument, which it refused for a missing VALUE)
    import infra.cli as cli
    from schemas.errors import GovernorError

    def no_broker(*args, **kwargs):
        raise GovernorError("no broker here")

    monkeypatch.setattr(cli, "_reachable", no_broker)
    monkeypatch.setattr(cli, "_with_topics", no_broker)
    hint = re.search(r"(governor config set [^,]+),", str(raised.value))[1]
    args = [SHAPE.model_dump_json() if arg == "{...}" else arg.replace("NAME", "nosuch-13b")
            for arg in shlex.split(hint)[1:]]
    result = CliRunner().invoke(cli.app, [*args, "--bootstrap", "127.0.0.1:1"])
    assert str(result.exception) == "no broker here", result.output


def test_a_sim_engine_runs_a_declared_model_and_a_too_large_one_gets_no_declaring_hint():
    models.configure_models({"nosuch-13b": SHAPE})
    try:
        engine = build_engine("sim", model="nosuch-13b")
        assert engine.perf.model.name == "nosuch-13b"
    finally:
        models.configure_models({})
    with pytest.raises(TerminalError) as too_large:
        build_engine("sim", model="llama-2-70b")
    assert str(too_large.value) == ("--tp 1: llama-2-70b does not fit on 1 h100 GPU (it needs "
                                    "tp 2 at least)")


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000", "ftp://host:8000",
                                 "http://", "http://host:99999", "http://host:port"])
def test_a_vllm_server_url_that_is_no_http_url_is_refused_at_once(url):
    # (before 5 Dec one without its scheme was tried for 30 s, then refused as "no vLLM server
    # answers at 127.0.0.1:8000", a server answering there or not)
    with pytest.raises(TerminalError, match=r"--vllm-url must be the server's http:// or "
                                            r"https:// URL, got ") as raised:
        build_engine("vllm", vllm_url=url)
    assert ("(http://" in str(raised.value)) == ("://" not in url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://vllm.internal/",
                                 "http://[::1]:8000"])
def test_a_vllm_server_url_is_taken(url):
    assert build_engine("vllm", vllm_url=url).base_url == url.rstrip("/")


@pytest.mark.parametrize("url, root", [("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
                                       ("http://host:8000/v1/", "http://host:8000"),
                                       ("https://gw/vllm-a/v1", "https://gw/vllm-a"),
                                       ("http://host:8000/?x=1", "http://host:8000"),
                                       ("http://host:8000#top", "http://host:8000")])
def test_a_vllm_server_url_with_the_openai_path_is_refused_with_its_root(url, root):
    # (the OpenAI base URL, ``.../v1``, was taken, and the worker then asked for
    # ``/v1/v1/models`` and reported that no server answered)
    with pytest.raises(TerminalError, match=r"--vllm-url must be the server's root URL, "
                                            r"without /v1") as raised:
        build_engine("vllm", vllm_url=url)
    assert str(raised.value).endswith(f"got {url!r} ({root}?)")


def test_a_vllm_server_behind_a_path_prefix_is_taken():
    assert build_engine("vllm", vllm_url="https://gw/vllm-a/").base_url == "https://gw/vllm-a"


@pytest.mark.parametrize(("model", "tp", "says"), [
    ("llama-2-70b", 3, "--tp 3 does not divide llama-2-70b's 64 attention heads (vLLM refuses "
                       "it): 1, 2, 4 or 8 does"),
    ("llama-3-8b", 6, "--tp 6 does not divide llama-3-8b's 32 attention heads"),
])
def test_a_sim_engine_refuses_a_tensor_parallelism_vllm_refuses(model, tp, says):
    """Before 6 Dec `governor worker --model llama-2-70b --tp 3` (and sim-server) ran, priced
    by the roofline formula, a split of the heads no vLLM server runs."""
    with pytest.raises(TerminalError) as raised:
        build_engine("sim", gpu="h100", model=model, tp=tp)
    assert str(raised.value).startswith(says), str(raised.value)
    assert build_engine("sim", gpu="h100", model=model, tp=8).perf.tp == 8  # (one that divides)
