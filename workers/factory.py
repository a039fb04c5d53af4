"""Build an engine by name: the one place that knows every engine a worker can run."""

from urllib.parse import urlsplit, urlunsplit

from schemas.errors import TerminalError
from workers.engine import Engine

ENGINES = ("sim", "fixed-rate", "vllm")
HOW_TO_DECLARE = (" (declare another by its shape: governor config set models.NAME '{...}', "
                  "then start the worker)")


def build_engine(
    kind: str,
    *,
    gpu: str = "h100",
    model: str = "llama-3-8b",
    tp: int = 1,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    max_model_len: int | None = None,
    cold: bool = False,
    decode_tokens_per_s: float = 100.0,
    now_s: float = 0.0,
    vllm_url: str | None = None,
    vllm_api_key: str | None = None,
) -> Engine:
    if kind == "fixed-rate":
        from workers.fixed_rate import FixedRateEngine

        return FixedRateEngine(decode_tokens_per_s=decode_tokens_per_s, max_num_seqs=max_num_seqs,
                               gpus=tp)  # (billed: it models none)
    if kind == "sim":
        from workers.sim.engine import SimEngine, SimEngineConfig
        from workers.sim.perf import PerfModel

        from workers.sim.models import is_known

        try:  # (the fit checked by check_tp, which names --tp and the degree that holds it)
            perf = PerfModel.load(gpu, model, tp, check_fit=False)
        except ValueError as exc:
            raise TerminalError(f"{exc}{'' if is_known(model) else HOW_TO_DECLARE}") from None
        check_tp(perf.model, tp, perf.gpu)
        if max_model_len is not None and max_model_len > (perf.max_model_len or max_model_len):
            # (sim-server's option: before 7 Dec the engine's words, naming no option)
            raise TerminalError(f"--max-model-len {max_model_len} is past {perf.model.name}'s "
                                f"context, {perf.max_model_len:,} tokens: it may only shorten "
                                "it, as vLLM's flag")
        config = SimEngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                 max_num_batched_tokens=max_num_batched_tokens)
        try:
            return SimEngine(perf, config, now_s=now_s, warm=not cold)
        except ValueError as exc:  # a max_model_len past the model's
            raise TerminalError(str(exc)) from None
    if kind == "vllm":
        from workers.vllm_engine import VllmHttpEngine

        if not vllm_url:
            raise TerminalError("the vllm engine needs the server's URL (--vllm-url)")
        check_server_url(vllm_url)
        # (serves ``model`` where the server lists it, else the one model it lists)
        return VllmHttpEngine(vllm_url, gpus=tp, api_key=vllm_api_key, worker_model=model)
    raise TerminalError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINES)}")


def check_tp(model, tp: int, gpu=None) -> None:
    """A ``--tp`` over which vLLM cannot split ``model``'s (a ``ModelSpec``'s) attention and
    KV heads is an error naming the degrees it can (``workers.sim.models.heads_refusal``); one
    whose GPUs of ``gpu`` (a ``GpuSpec``, where given) do not hold the model, an error naming
    the least degree that does (``tp_refusal``). (Before 7 Dec the second was the engine's
    ``llama-2-70b does not fit on 1 x h100``, naming neither ``--tp`` nor its fix, and a
    worker said it only once it had reached a broker.)"""
    from workers.sim.models import TP_SIZES, heads_refusal, tp_refusal

    why = heads_refusal(model, tp)
    if why:
        fits = [str(n) for n in TP_SIZES if heads_refusal(model, n) is None]
        which = f"{', '.join(fits[:-1])} or {fits[-1]} does" if len(fits) > 1 else "1 does"
        raise TerminalError(f"--{why}: {which}")
    why = tp_refusal(model, gpu, tp) if gpu is not None else None
    if why:
        raise TerminalError(f"--{why}")


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http or https URL with a host (and, if it names one, a valid port)."""
    parts = urlsplit(url)
    try:
        return parts.scheme in ("http", "https") and bool(parts.hostname) and (
            parts.port is None or parts.port > 0)
    except ValueError:  # (a port that is no number, or past 65535)
        return False


def check_server_url(url: str) -> None:
    """A vLLM server's base URL is an http or https one with a host (and a valid port): one
    without its scheme (``127.0.0.1:8000``) was tried for 30 s and refused as ``no vLLM server
    answers at 127.0.0.1:8000``, whether a server answered there or not."""
    if not is_http_url(url):
        hint = f" (http://{url}?)" if "://" not in url else ""
        raise TerminalError(f"--vllm-url must be the server's http:// or https:// URL, "
                            f"got {url!r}{hint}")
    parts = urlsplit(url)
    if parts.path.rstrip("/").endswith("/v1") or parts.query or parts.fragment:
        # (the OpenAI base URL, ``http://host:8000/v1``, was taken and asked for
        # ``/v1/v1/models``; a proxy's path prefix is fine: the calls go under it)
        root = urlunsplit((parts.scheme, parts.netloc,
                           parts.path.rstrip("/").removesuffix("/v1"), "", ""))
        raise TerminalError(f"--vllm-url must be the server's root URL, without /v1, a query "
                            f"or a fragment (Governor calls /v1/completions, /metrics and "
                            f"/version under it), got {url!r} ({root}?)")
