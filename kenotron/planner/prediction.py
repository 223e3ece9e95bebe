"""The throughput model's prediction for one layout on a stated network, as `kenotron estimate`
prints it under the memory report: tokens/s per GPU and what the step is made of. A prediction,
not a measurement: the model's fitted constants and its error on the measured rows are in
docs/estimation.md (Throughput model)."""

from __future__ import annotations

from kenotron.planner.analytic_model import AnalyticModel
from kenotron.planner.hardware import Hardware
from kenotron.planner.throughput import StepTime, step_time
from kenotron.train.resolve import ResolvedRun


def network(hw: Hardware, world: int) -> str:
    """The cluster `hw` describes, in words."""
    nodes = -(-world // hw.gpus_per_node)
    inside = f"{hw.nvlink_bytes_per_s / 1e9:.0f} GB/s bus bandwidth inside a node"
    if nodes == 1:
        return f"{world} {hw.gpu} GPUs in one node, {inside}"
    return (f"{world} {hw.gpu} GPUs, {hw.gpus_per_node} per node ({nodes} nodes), {inside}, "
            f"{hw.network_bytes_per_s / 1e9:.0f} GB/s per GPU between nodes")


def format_prediction(step: StepTime, hw: Hardware) -> str:
    parts = ", ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in step.parts().items() if seconds > 0)
    return (f"Predicted by the throughput model, not measured: {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU on "
            f"{network(hw, step.world)}.\n  Step {step.seconds * 1e3:.1f} ms: {parts} (ms; docs/estimation.md, "
            "Throughput model)")


def predict(run: ResolvedRun, hw: Hardware | None = None, document_tokens: float | None = None) -> str:
    """The prediction's lines for `run` on `hw` (the default cluster: H200s, 8 per node). With
    data.document_masking, one more line says the documents and the masked attention work priced
    (`document_tokens`: their mean length; masked_attention.document_lengths says the default)."""
    hw = hw or Hardware()
    step = step_time(run, AnalyticModel(run), hw, document_tokens)
    note = f"\n  {step.documents.describe()}" if step.documents is not None else ""
    return format_prediction(step, hw) + note
