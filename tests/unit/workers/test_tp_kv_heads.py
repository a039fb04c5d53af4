"""vLLM splits the KV heads over a worker's GPUs too, not only the attention heads
(``QKVParallelLinear``): under ``n_kv_heads`` GPUs, ``tp`` must divide them; from
``n_kv_heads`` GPUs on, they must divide ``tp`` (each is held by ``tp / n_kv_heads`` GPUs).
``heads_refusal``, shared by ``tp_refusal``, ``least_tp`` and a worker's ``--tp``, refuses both.
Before 6 Dec (evening) it looked at the attention heads only: a model of 20 heads and 4 KV heads
too large for 4 H100s got tp 5, which vLLM refuses."""

import pytest

from schemas.errors import TerminalError
from workers.factory import check_tp
from workers.sim.models import GPUS, ModelSpec, heads_refusal, least_tp, tp_refusal


def shape(n_heads: int, n_kv_heads: int, params_b: float = 8.0) -> ModelSpec:
    return ModelSpec(f"m-{n_heads}-{n_kv_heads}", params_b, 32, n_heads, n_kv_heads, 128, 4096,
                     14336, 128256)


@pytest.mark.parametrize(("n_heads", "n_kv_heads", "tp", "refused"), [
    (32, 8, 4, None), (32, 8, 8, None),  # 2 KV heads a GPU; 1 a GPU
    (32, 1, 8, None),  # one KV head, on every GPU
    (40, 40, 5, None), (48, 3, 6, None),  # 8 KV heads a GPU; each of 3 on 2 GPUs
    (24, 6, 4, "tp 4 does not divide m-24-6's 6 KV heads (vLLM refuses it)"),
    (40, 8, 5, "tp 5 does not divide m-40-8's 8 KV heads (vLLM refuses it)"),
    (20, 4, 5, "tp 5 is not a multiple of m-20-4's 4 KV heads (vLLM replicates each KV head "
               "over tp / 4 GPUs, and refuses it)"),
    (48, 3, 4, "tp 4 is not a multiple of m-48-3's 3 KV heads"),
    (32, 8, 3, "tp 3 does not divide m-32-8's 32 attention heads (vLLM refuses it)"),
])
def test_the_kv_heads_are_split_or_replicated_evenly(n_heads, n_kv_heads, tp, refused):
    why = heads_refusal(shape(n_heads, n_kv_heads), tp)
    assert (why or "").startswith(refused or "") and (why is None) == (refused is None), why


def test_the_least_degree_divides_the_kv_heads_as_well() -> None:
    """20 heads and 4 KV heads, too large for 4 H100s: 5 divides the heads, not the KV heads
    (vLLM refuses it), and 6, 7 and 8 do not divide the heads: no degree serves it; with 5 KV
    heads 5 does."""
    h100 = GPUS["h100"]
    four_kv, five_kv = shape(20, 4, params_b=160.0), shape(20, 5, params_b=160.0)
    assert tp_refusal(four_kv, h100, 4).startswith("tp 4: m-20-4 does not fit on 4 h100 GPUs")
    assert least_tp(four_kv, h100) is None
    assert "4 KV heads" in tp_refusal(four_kv, h100, 5)
    assert least_tp(five_kv, h100) == 5 and tp_refusal(five_kv, h100, 5) is None


def test_a_worker_tp_names_the_degrees_that_suit_both_heads() -> None:
    with pytest.raises(TerminalError) as raised:
        check_tp(shape(24, 6), 4)
    assert str(raised.value) == ("--tp 4 does not divide m-24-6's 6 KV heads (vLLM refuses it): "
                                 "1, 2, 3 or 6 does")


@pytest.mark.parametrize(("n_kv_heads", "tp", "held"), [(8, 2, 4), (8, 8, 1), (1, 4, 1),
                                                        (3, 6, 1)])
def test_a_gpu_holds_the_kv_of_its_share_of_the_kv_heads_one_at_least(n_kv_heads, tp, held):
    """Each GPU caches ``max(1, n_kv_heads / tp)`` KV heads, as vLLM's
    ``ModelConfig.get_num_kv_heads``: a replicated head costs every GPU that holds it."""
    model = shape(48, n_kv_heads)
    assert model.kv_bytes_per_token_per_gpu(tp) == model.kv_bytes_per_token * held / n_kv_heads
