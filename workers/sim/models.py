"""What the simulated engine needs to know of a model and a GPU, and the roofline formula.

``ModelSpec`` carries the architecture (weights and KV-cache bytes, FLOPs per token); ``GpuSpec``
the public datasheet figures plus a few efficiency constants. ``roofline_ms`` is the fallback step
time used where no measured table exists (``PerfModel.source == "formula"``).

Datasheet figures (dense bf16 tensor-core peak, HBM bandwidth, NVLink per GPU and direction):
- A100-SXM4-80GB: 312 TFLOPS, 2.039 TB/s HBM2e, 300 GB/s NVLink 3 (NVIDIA A100 datasheet).
- H100-SXM5-80GB: 989 TFLOPS, 3.35 TB/s HBM3, 450 GB/s NVLink 4 (NVIDIA H100 datasheet).
- H200-SXM-141GB: 989 TFLOPS, 4.8 TB/s HBM3e, 450 GB/s NVLink 4 (NVIDIA H200 datasheet).
The same figures appear in AIConfigurator's ``system.yaml`` files under
``shared/data/calibration/aiconfigurator_vllm/<gpu>/``.

``memory_bytes`` is the total the CUDA driver reports (nvidia-smi ``memory.total``: 81920 MiB,
81559 MiB, 143771 MiB), which is what vLLM multiplies by ``gpu_memory_utilization``.

The efficiency constants (``prefill_mfu`` ...) were fitted by grid search to the Llama-3-8B
composite tables (minimising the worst error at the README's headline points plus the mean error
over all grid points from 256 tokens or any decode batch); the headline figures come out within
6%. ``benchmarks/fidelity.py`` section 4 shows the fit. They are efficiencies of *this* formula,
not measured utilisations: e.g. the A100's small-step floor folded into ``weights_bw_eff``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

#: Memory outside PyTorch's allocator: CUDA context, cuBLAS/NCCL workspaces (AIConfigurator's
#: ``other_mem`` was 551 MB before its authors padded it for safety).
NON_TORCH_BYTES = GIB // 2
#: Extra NCCL buffers per GPU when tensor-parallel (AIConfigurator ``misc.nccl_mem``: 342–392 MB).
NCCL_BYTES = 392 * MIB
#: vLLM's profiling pass runs one forward of this many tokens and sizes activations from it.
PROFILE_BATCHED_TOKENS = 8192
#: ... and samples this many sequences (``max_num_seqs``) with fp32 logits.
PROFILE_NUM_SEQS = 256


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape: enough for weights, KV bytes and FLOPs."""

    name: str
    params_b: float  # parameters, billions
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    #: The longest sequence (prompt and output) it serves: vLLM's ``max_model_len``, from the
    #: model's ``max_position_embeddings``. None: as long as the KV cache holds.
    max_model_len: int | None = None

    @property
    def weights_bytes(self) -> int:
        return int(self.params_b * 1e9 * self.dtype_bytes)

    @property
    def gemm_params(self) -> float:
        """Parameters every token multiplies through: all but the embedding and the lm_head
        (untied in all three models; the lm_head only runs for sampled tokens)."""
        return self.params_b * 1e9 - 2 * self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: 2 * n_layers * n_kv_heads * head_dim * dtype."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV heads are split across TP ranks, replicated when there are fewer heads than ranks:
        each rank holds ``max(1, n_kv_heads / tp)`` of them, as vLLM's
        ``ModelConfig.get_num_kv_heads`` (at a degree ``heads_refusal`` takes)."""
        heads_per_gpu = math.ceil(self.n_kv_heads / tp)
        return 2 * self.n_layers * heads_per_gpu * self.head_dim * self.dtype_bytes

    def kv_capacity_tokens(self, gpu: GpuSpec, tp: int,
                           gpu_memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache per GPU (``PerfModel.kv_capacity_tokens`` says how); 0: the
        weights leave no room for any."""
        free = (gpu.memory_bytes * gpu_memory_utilization - self.weights_bytes / tp
                - self.activation_reserve_bytes(tp))
        return max(0, int(free // self.kv_bytes_per_token_per_gpu(tp)))

    def activation_reserve_bytes(self, tp: int) -> int:
        """Peak non-KV memory vLLM's profiling pass finds, per GPU (an estimate, documented).

        non-torch memory (0.5 GiB) + NCCL buffers when tp > 1
        + PROFILE_BATCHED_TOKENS * dtype * (2 * hidden + 3 * intermediate / tp)   (residual, norm
          output, gate_up output and activation live at the MLP peak)
        + 2 * PROFILE_NUM_SEQS * vocab * 4                                       (fp32 logits, twice)
        """
        per_token = self.dtype_bytes * (2 * self.hidden_size + 3 * self.intermediate_size / tp)
        logits = 2 * PROFILE_NUM_SEQS * self.vocab_size * 4
        nccl = NCCL_BYTES if tp > 1 else 0
        return int(NON_TORCH_BYTES + nccl + PROFILE_BATCHED_TOKENS * per_token + logits)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type: datasheet figures and the roofline's efficiency constants."""

    name: str
    label: str  # as the calibration tables spell it
    memory_bytes: int
    peak_bf16_flops: float  # dense
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU, one direction
    prefill_mfu: float  # fraction of peak the GEMMs reach when compute-bound
    attention_mfu: float  # ... and prefill attention
    weights_bw_eff: float  # fraction of HBM bandwidth when streaming the weights
    kv_bw_eff: float  # ... and the KV cache in decode attention
    step_floor_ms: float  # launch latency, lm_head, norms: what a tiny step still costs
    allreduce_latency_s: float = 10e-6  # AIConfigurator's p2p_latency


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # meta-llama/Meta-Llama-3-8B config.json, with the context of Llama 3.1 8B (the same
        # shape): Llama 3's 8,192 tokens would refuse most of the Mooncake trace (up to 126,527)
        ModelSpec("llama-3-8b", 8.03, 32, 32, 8, 128, 4096, 14336, 128256, max_model_len=131072),
        # meta-llama/Llama-2-7b-hf
        ModelSpec("llama-2-7b", 6.74, 32, 32, 32, 128, 4096, 11008, 32000, max_model_len=4096),
        # meta-llama/Llama-2-70b-hf
        ModelSpec("llama-2-70b", 68.98, 80, 64, 8, 128, 8192, 28672, 32000, max_model_len=4096),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100", "A100-SXM4-80GB", 81920 * MIB, 312e12, 2.039e12, 300e9,
                prefill_mfu=0.62, attention_mfu=0.75, weights_bw_eff=0.70, kv_bw_eff=0.70,
                step_floor_ms=0.0),
        GpuSpec("h100", "H100-SXM-80GB", 81559 * MIB, 989e12, 3.35e12, 450e9,
                prefill_mfu=0.70, attention_mfu=0.80, weights_bw_eff=0.86, kv_bw_eff=0.75,
                step_floor_ms=1.2),
        GpuSpec("h200", "H200-SXM-141GB", 143771 * MIB, 989e12, 4.8e12, 450e9,
                prefill_mfu=0.70, attention_mfu=0.75, weights_bw_eff=0.82, kv_bw_eff=0.85,
                step_floor_ms=1.4),
    )
}


#: The tensor parallelisms modelled: any from 1 to 8 GPUs a worker (one node), as vLLM takes
#: any degree that splits the model's heads evenly (``tp_refusal``: the one rule of a
#: worker's ``--tp``, a fleet's ``/tpN`` and the degree chosen where none is named).
TP_SIZES = tuple(range(1, 9))


def least_tp(model: ModelSpec, gpu: GpuSpec) -> int | None:
    """The least of ``TP_SIZES`` that ``tp_refusal`` takes for ``model`` on ``gpu``: one that
    splits its heads (``heads_refusal``) and whose GPUs hold it with room for KV cache (None:
    none).
    (Before 6 Dec it tried 1, 2, 4 and 8 only, heads aside: a model of 40 heads and 40 KV heads
    too large for 4 GPUs got 8, a degree vLLM refuses, where 5 serves it.)"""
    return next((tp for tp in TP_SIZES
                 if heads_refusal(model, tp) is None and model.kv_capacity_tokens(gpu, tp)), None)


def no_tp(model: ModelSpec, gpu: GpuSpec) -> str:
    """Why ``least_tp`` finds no degree for ``model`` on ``gpu``."""
    if not model.kv_capacity_tokens(gpu, TP_SIZES[-1]):
        return f"{model.name} does not fit on {TP_SIZES[-1]} x {gpu.name}"
    return (f"{model.name} fits on {gpu.name} at no tensor parallelism from 1 to "
            f"{TP_SIZES[-1]} that divides its {model.n_heads} attention heads and splits its "
            f"{model.n_kv_heads} KV heads evenly (vLLM refuses any other: heads_refusal)")


def tp_out_of_range(tp: int) -> str | None:
    """Why ``tp`` GPUs a worker are past what is modelled (None: they are not)."""
    if 1 <= tp <= TP_SIZES[-1]:
        return None
    return f"tp {tp} is not from 1 to {TP_SIZES[-1]} (GPUs a worker)"


def heads_refusal(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM refuses ``model`` at ``tp`` GPUs whatever they are (None: it does not): it
    splits the attention heads evenly over its GPUs, and the KV heads too, or, from as many
    GPUs as KV heads on, holds each KV head on ``tp / n_kv_heads`` of them. As vLLM's
    ``QKVParallelLinear`` (vllm/model_executor/layers/linear.py) does: ``num_heads =
    divide(total_num_heads, tp_size)``, then ``divide(total_num_kv_heads, tp_size)`` under
    ``tp_size`` KV heads, else ``num_kv_head_replicas = divide(tp_size, total_num_kv_heads)``;
    ``divide`` fails where the one does not divide the other."""
    if model.n_heads % tp:
        return (f"tp {tp} does not divide {model.name}'s {model.n_heads} attention heads (vLLM "
                "refuses it)")
    if tp < model.n_kv_heads and model.n_kv_heads % tp:
        return (f"tp {tp} does not divide {model.name}'s {model.n_kv_heads} KV heads (vLLM "
                "refuses it)")
    if tp >= model.n_kv_heads and tp % model.n_kv_heads:
        return (f"tp {tp} is not a multiple of {model.name}'s {model.n_kv_heads} KV heads (vLLM "
                f"replicates each KV head over tp / {model.n_kv_heads} GPUs, and refuses it)")
    return None


def tp_refusal(model: ModelSpec, gpu: GpuSpec, tp: int) -> str | None:
    """Why a worker of ``model`` cannot run on ``tp`` GPUs of ``gpu`` (None: it can): a degree
    past ``TP_SIZES[-1]``, one over which vLLM cannot split its heads (``heads_refusal``: its
    attention heads, and its KV heads), or one whose GPUs leave no room for KV cache."""
    why = tp_out_of_range(tp)
    if why:
        return why
    why = heads_refusal(model, tp)
    if why:
        return why
    if not model.kv_capacity_tokens(gpu, tp):
        least = least_tp(model, gpu)
        return (f"tp {tp}: {model.name} does not fit on {tp} {gpu.name} GPU"
                f"{'s' if tp > 1 else ''} (it needs "
                f"{f'tp {least}' if least else f'more than {TP_SIZES[-1]}'} at least)")
    return None


#: Models declared in the configuration (``GovernorConfig.models``), beside ``MODELS``.
CONFIGURED: dict[str, ModelSpec] = {}
#: The declared models' names as the configuration spells them, by lower-case name (their
#: specs are named in lower case, as they are looked up).
DECLARED_AS: dict[str, str] = {}


def is_known(name: str) -> bool:
    """Built in or declared."""
    return name.lower() in MODELS or name.lower() in CONFIGURED


def check_spelling(name: str) -> None:
    """Raises ``ValueError`` for a built-in or declared model's name in other letter case:
    models are looked up in any case, but a request is matched to a worker by its model's exact
    name. (Before 7 Dec a declared model's passed.)"""
    key = name.lower()
    spelt = key if key in MODELS else DECLARED_AS.get(key, name)
    if name != spelt:
        raise ValueError(f"model {name!r} is named {spelt!r}: a pool serves the requests "
                         "that name its model exactly")


class DeclaredReads:
    """When a command naming models this process does not know (a worker's ``load_model``, the
    supervisor's ``ScalePool``) reads the models the configuration declares again: at once for
    a model no read of the last ``every_s`` looked for in vain; not for one that did (a stream
    of commands naming a misspelt model reads once every ``every_s``). Before 7 Dec any read
    waited ``every_s`` after the last, and a model declared just after a read for another was
    refused as unknown, though ``governor command`` had read it declared."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._missed: dict[str, float] = {}  # model -> when a read did not find it

    async def learn(self, names: Iterable[str],
                    read: Callable[[set[str]], Awaitable[None]]) -> None:
        """``read`` the declared models (``configure_models``) for those of ``names`` not known,
        where due; a read that fails leaves them unknown."""
        now = time.monotonic()
        self._missed = {name: at for name, at in self._missed.items()
                        if now - at < self.every_s}
        unknown = {name for name in names if not is_known(name)}
        if unknown <= self._missed.keys():
            return
        try:
            await read(unknown)
        finally:
            self._missed.update((name, now) for name in unknown if not is_known(name))


def configure_models(shapes: Mapping[str, Any]) -> bool:
    """Declare the configuration's models (``name -> ModelShape``), replacing those declared
    before; return whether they changed. Raises ``ValueError`` as ``model_specs``, declaring
    nothing."""
    specs = model_specs(shapes)
    spellings = {name.lower(): name for name in shapes}
    if specs == CONFIGURED and spellings == DECLARED_AS:
        return False
    CONFIGURED.clear()
    CONFIGURED.update(specs)
    DECLARED_AS.clear()
    DECLARED_AS.update(spellings)
    return True


def model_specs(shapes: Mapping[str, Any]) -> dict[str, ModelSpec]:
    """The specs of the configuration's models (``name -> ModelShape``) by lower-case name.
    Raises ``ValueError`` for a built-in model's name (its measured tables would not follow a
    shape given here), two names that differ in case only, or a model too large for
    ``TP_SIZES[-1]`` of every GPU known."""
    specs: dict[str, ModelSpec] = {}
    for name, shape in shapes.items():
        key = name.lower()
        if key in MODELS:
            raise ValueError(f"models.{name}: {key} is built in; declare a model under a name of "
                             f"its own (built in: {', '.join(sorted(MODELS))})")
        if key in specs:
            raise ValueError(f"models.{name}: declared twice, in two cases")
        spec = specs[key] = ModelSpec(key, **shape.model_dump())
        if all(least_tp(spec, gpu) is None for gpu in GPUS.values()):
            raise ValueError(f"models.{name}: its weights ({spec.weights_bytes / 1e9:,.0f} GB) "
                             f"leave no room for KV cache on {TP_SIZES[-1]} of any GPU known "
                             f"({', '.join(sorted(GPUS))})")
    return specs


def model_spec(name: str) -> ModelSpec:
    key = name.lower()
    spec = MODELS.get(key) or CONFIGURED.get(key)
    if spec is None:
        known = sorted(MODELS) + sorted(CONFIGURED)
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known)}")
    return spec


def gpu_spec(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown gpu {name!r}; known: {', '.join(sorted(GPUS))}") from None


def check_gpu_spelling(name: str) -> None:
    """Raises ``ValueError`` for a known GPU type in other letter case: GPUs are looked up in
    any case, but pools are named in lower case (``infra.stack.parse_fleet``), as workers
    heart-beat them."""
    if name != name.lower() and name.lower() in GPUS:
        raise ValueError(f"gpu {name!r} is named {name.lower()!r}")


def roofline_ms(gpu: GpuSpec, model: ModelSpec, tp: int, prefill_tokens: int,
                prefill_context: float, prefill_seqs: int, decode_seqs: int,
                decode_context: float) -> float:
    """GPU time of one step by roofline, in ms (no CPU-side overhead).

    GEMMs:     max(weights / tp / (hbm_bw * weights_bw_eff),
                   2 * (gemm_params * tokens + vocab * hidden * sampled) / tp / (peak * prefill_mfu))
               (tokens = prefill_tokens + decode_seqs; sampled = one per sequence in the step)
    prefill attention (causal, each of ``prefill_seqs`` chunks of n tokens after c cached ones):
               4 * n_layers * n_heads * head_dim * (n * c + n^2 / 2) / tp / (peak * attention_mfu)
    decode attention: decode_seqs * decode_context * kv_bytes_per_token / tp / (hbm_bw * kv_bw_eff)
    tensor parallel: 2 all-reduces per layer of tokens * hidden * dtype, ring over NVLink
    plus ``step_floor_ms``.
    """
    tokens = prefill_tokens + decode_seqs
    if tokens <= 0:
        return 0.0
    sampled = decode_seqs + (max(1, prefill_seqs) if prefill_tokens > 0 else 0)
    gemm_flops = 2 * (model.gemm_params * tokens + model.vocab_size * model.hidden_size * sampled)
    gemm_s = max(model.weights_bytes / tp / (gpu.hbm_bytes_per_s * gpu.weights_bw_eff),
                 gemm_flops / tp / (gpu.peak_bf16_flops * gpu.prefill_mfu))
    attention_s = 0.0
    if prefill_tokens > 0:
        seqs = max(1, prefill_seqs)
        n, c = prefill_tokens / seqs, prefill_context / seqs
        flops = 4 * model.n_layers * model.n_heads * model.head_dim * seqs * (n * c + n * n / 2)
        attention_s += flops / tp / (gpu.peak_bf16_flops * gpu.attention_mfu)
    if decode_seqs > 0:
        kv_bytes = decode_seqs * decode_context * model.kv_bytes_per_token_per_gpu(tp)
        attention_s += kv_bytes / (gpu.hbm_bytes_per_s * gpu.kv_bw_eff)
    comm_s = 0.0
    if tp > 1:
        ring_bytes = tokens * model.hidden_size * model.dtype_bytes * 2 * (tp - 1) / tp
        comm_s = 2 * model.n_layers * (gpu.allreduce_latency_s + ring_bytes / gpu.nvlink_bytes_per_s)
    return 1e3 * (gemm_s + attention_s + comm_s) + gpu.step_floor_ms
