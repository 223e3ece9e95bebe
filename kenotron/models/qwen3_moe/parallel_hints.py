"""How the MoE families split under tensor and expert parallelism, as plain data.

Attention, norms, embedding and output take Llama 3's tensor-parallel styles. The MoE
feed-forward has no tensor-parallel style: under tp it runs on this rank's sequence shard
with its weights replicated over tp (gradients summed over tp), and its experts are what
expert parallelism shards (kenotron/parallel/expert.py).
"""

from __future__ import annotations

from kenotron.models.llama3.parallel_hints import LLAMA3_TP_STYLES

MOE_TP_STYLES: dict[str, str] = {
    k: v for k, v in LLAMA3_TP_STYLES.items() if not k.startswith("layers.*.feed_forward")
}
MOE_MODULES = "layers.*.feed_forward"
EXPERTS = "layers.*.feed_forward.experts"
