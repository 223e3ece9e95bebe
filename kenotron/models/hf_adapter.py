"""Hugging Face state-dict adapters: kenotron names and args <-> transformers names and config.json.

An adapter renames keys; it never transposes a tensor (kenotron's RoPE already uses HF's
"rotate half" layout). It converts one tensor at a time, which is how the converters stream:
`to_hf_key` and `hf_names` name what an export writes; `from_hf_sources` says which HF tensors
each kenotron tensor is built from and `from_hf_tensor` builds it, reading them when needed.
`to_hf` and `from_hf` do whole state dicts. A family may also list tensors whose rows it
stores in another order (`reorder`: Mamba-2's in-projection, grouped for tensor parallel);
those are reordered one tensor at a time on full (gathered) tensors, which is what every
conversion path here hands the adapter.

Each family fills an `HFAdapter` in its own `hf.py` and attaches it to its `ModelSpec`.

MoE families add two kinds of keys: experts stacked in one tensor here and stored one per
expert on the hub (`expert_keys`, see hf_experts.py: export slices, import stacks), and
router biases the transformers classes do not have (`zero_keys`: zero on import, and a
nonzero one refuses export, since the routing could not be reproduced there).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kenotron.models.common.rope_scaling import RopeScaling
from kenotron.models.hf_experts import (
    ExpertKeyError,
    expert_sources,
    match_expert_key,
    split_experts,
    stack_experts,
)

_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(.+)$")

RowOrder = Callable[[torch.Tensor, Any, bool], torch.Tensor]
"""(tensor, the family's args, to_hf) -> the tensor with its rows in HF's order (to_hf) or kenotron's."""

# Keys that old checkpoints carry but that are recomputed, not learned.
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


class HFConversionError(ValueError):
    """A key, config value or architecture that an adapter cannot convert."""


@dataclass(frozen=True)
class HFAdapter:
    """How one model family maps to its transformers counterpart (see the module docstring)."""

    architecture: str
    """The transformers class named in config.json's `architectures`, e.g. "LlamaForCausalLM"."""
    model_type: str
    """config.json's `model_type`, e.g. "llama"."""
    top_keys: Mapping[str, str]
    """{kenotron key: HF key} for the parameters outside the blocks."""
    layer_keys: Mapping[str, str]
    """{kenotron key suffix: HF key suffix} inside block i ("layers.{i}." <-> "model.layers.{i}.")."""
    args_from_config: Callable[[dict[str, Any]], Any]
    """config.json (as a dict) -> the family's args dataclass; raises HFConversionError on a
    setting the kenotron model does not implement."""
    config_from_args: Callable[[Any], dict[str, Any]]
    """The family's args -> a config.json dict that transformers loads as `architecture`."""
    expert_keys: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """{kenotron key suffix of a tensor stacked over experts: its per-expert HF key suffixes ("{e}" = expert), in row order}."""
    zero_keys: tuple[str, ...] = ()
    """Kenotron key suffixes inside a block that HF lacks: zero on import, must be zero on export."""
    hf_layer_prefix: str = "model.layers"
    """Where the blocks live in the HF state dict ("backbone.layers" for Mamba-2)."""
    reorder: Mapping[str, RowOrder] = dataclasses.field(default_factory=dict)
    """{kenotron key suffix inside a block: how its rows convert} for tensors stored in another row order."""
    check_export: Callable[[Any], None] | None = None
    """Raises HFConversionError for args that the HF class cannot represent (called by `to_hf`)."""
    copied_layer_keys: tuple[str, ...] = ()
    """HF key suffixes inside a block that copy a weight kenotron keeps once (DeepSeek's MTP layers'
    `embed_tokens.weight`): skipped on import, not written on export."""

    # -- config ---------------------------------------------------------------------------------

    def args_from_hf_config(self, config: Mapping[str, Any], *, max_seq_len: int = 0) -> Any:
        """Args from a config.json dict. `max_seq_len` (0: the config's max_position_embeddings)
        sizes the RoPE tables; pass the longest sequence you will run to keep them small."""
        model_type = config.get("model_type")
        if model_type is not None and model_type != self.model_type:
            raise HFConversionError(
                f"config.json has model_type={model_type!r} but this adapter converts {self.model_type!r}; "
                f"use the family whose adapter has model_type {model_type!r}"
            )
        args = self.args_from_config(dict(config))
        if max_seq_len:
            args = dataclasses.replace(args, max_seq_len=max_seq_len)
        return args

    def hf_config_from_args(self, args: Any) -> dict[str, Any]:
        """A config.json dict (architectures, model_type and the dimensions) for `args`."""
        return {"architectures": [self.architecture], "model_type": self.model_type, **self.config_from_args(args)}

    # -- keys -----------------------------------------------------------------------------------

    def to_hf_key(self, key: str) -> str:
        """The HF name of a kenotron parameter name."""
        match = _LAYER_KEY.match(key)
        if match and match.group(2) in self.layer_keys:
            return f"{self.hf_layer_prefix}.{match.group(1)}.{self.layer_keys[match.group(2)]}"
        if match and match.group(2) in self.expert_keys:  # named by its first per-expert part
            return f"{self.hf_layer_prefix}.{match.group(1)}.{self.expert_keys[match.group(2)][0]}"
        if key in self.top_keys:
            return self.top_keys[key]
        raise HFConversionError(f"{key!r} has no Hugging Face name in the {self.model_type} adapter")

    def from_hf_key(self, hf_key: str) -> str:
        """The kenotron name of an HF parameter name."""
        match = re.match(rf"^{re.escape(self.hf_layer_prefix)}\.(\d+)\.(.+)$", hf_key)
        if match:
            for ours, theirs in self.layer_keys.items():
                if theirs == match.group(2):
                    return f"layers.{match.group(1)}.{ours}"
        for ours, theirs in self.top_keys.items():
            if theirs == hf_key:
                return ours
        raise HFConversionError(
            f"{hf_key!r} has no kenotron name in the {self.model_type} adapter: is the checkpoint a "
            f"{self.architecture}?"
        )

    def is_ignored_hf_key(self, hf_key: str) -> bool:
        """Keys that carry no learned weight (e.g. old checkpoints' `rotary_emb.inv_freq`) or copy one
        (`copied_layer_keys`)."""
        suffix = hf_key.split(".", 2 + self.hf_layer_prefix.count("."))[-1]
        if hf_key.startswith(self.hf_layer_prefix + ".") and suffix in self.copied_layer_keys:
            return True
        return hf_key.endswith(_IGNORED_HF_SUFFIXES)

    # -- state dicts ----------------------------------------------------------------------------

    def _reordered(self, key: str, value: torch.Tensor, args: Any, to_hf: bool) -> torch.Tensor:
        match = _LAYER_KEY.match(key)
        order = self.reorder.get(match.group(2)) if match else None
        # Non-tensor values pass as they are: callers map names through `to_hf({name: name})`.
        return order(value, args, to_hf) if order is not None and isinstance(value, torch.Tensor) else value

    def to_hf(self, state_dict: Mapping[str, torch.Tensor], args: Any) -> dict[str, torch.Tensor]:
        """kenotron state dict -> HF state dict; the same tensor objects, renamed (stacked experts:
        views of each expert; `reorder`'s tensors: reordered copies).

        With tied embeddings the output projection is left out, as HF stores only
        `model.embed_tokens.weight` then.
        """
        if self.check_export is not None:
            self.check_export(args)
        out: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            if _tied(args) and key == "output.weight":
                continue
            match = _LAYER_KEY.match(key)
            suffix = match.group(2) if match else None
            if suffix in self.zero_keys:
                if value.device.type != "meta" and bool(value.any()):
                    raise HFConversionError(
                        f"{key!r} is not zero: the model was trained with an expert bias (moe.bias_update_rate), "
                        f"which {self.architecture} does not have; its routing cannot be exported"
                    )
                continue
            if suffix in self.expert_keys:
                out.update(split_experts(value, f"{self.hf_layer_prefix}.{match.group(1)}.", self.expert_keys[suffix]))
                continue
            out[self.to_hf_key(key)] = self._reordered(key, value, args, to_hf=True)
        return out

    def hf_names(self, key: str, shape: tuple[int, ...], args: Any) -> dict[str, tuple[int, ...]]:
        """{HF name: shape} of the kenotron tensor `key` of `shape`, as `to_hf` would write it: none
        for a tied output or a key HF lacks, one per expert and part for a stacked tensor."""
        if _tied(args) and key == "output.weight":
            return {}
        match = _LAYER_KEY.match(key)
        suffix = match.group(2) if match else None
        if suffix in self.zero_keys:
            return {}
        if suffix in self.expert_keys:
            parts = self.expert_keys[suffix]
            piece = (shape[1] // len(parts), *shape[2:])
            return {f"{self.hf_layer_prefix}.{match.group(1)}.{t.format(e=e)}": piece for e in range(shape[0]) for t in parts}
        return {self.to_hf_key(key): tuple(shape)}

    def from_hf_sources(self, hf_keys: Iterable[str], args: Any) -> dict[str, tuple[str, ...]]:
        """{kenotron key: the HF keys it is built from} for a checkpoint holding `hf_keys`: one,
        renamed; every expert's parts of a stacked tensor, in row order; none for a router bias
        HF lacks (zeros); the embedding for a tied output (whether or not the checkpoint also
        stores an `lm_head.weight`). In `from_hf`'s order: the checkpoint's, then the stacked
        tensors, the zeros and a tied output."""
        out: dict[str, tuple[str, ...]] = {}
        pieces: dict[str, dict[tuple[int, int], str]] = {}
        for key in hf_keys:
            if self.is_ignored_hf_key(key):
                continue
            expert = self._expert_of(key)
            if expert is None:
                out[self.from_hf_key(key)] = (key,)
            else:
                ours, e, part = expert
                pieces.setdefault(ours, {})[e, part] = key
        for ours, parts in pieces.items():
            suffix = _LAYER_KEY.match(ours).group(2)
            try:
                out[ours] = expert_sources(parts, args.moe.n_experts, len(self.expert_keys[suffix]), ours)
            except ExpertKeyError as e:
                raise HFConversionError(str(e)) from e
        for layer in self._layers_of(out):
            for suffix in self.zero_keys:
                out[f"layers.{layer}.{suffix}"] = ()
        if _tied(args):
            if "tok_embeddings.weight" not in out:
                raise HFConversionError(f"a model with tied embeddings needs {self.top_keys['tok_embeddings.weight']!r}")
            out["output.weight"] = out["tok_embeddings.weight"]
        return out

    def from_hf_tensor(self, key: str, sources: tuple[str, ...], read: Callable[[str], torch.Tensor],
                       args: Any) -> torch.Tensor:
        """The kenotron tensor `key` from its HF `sources` (`from_hf_sources`), each read with
        `read(hf_key)` when it is needed: a renamed tensor is the one read (rows reordered where
        the family says so), a stacked one is filled one expert at a time (a copy)."""
        match = _LAYER_KEY.match(key)
        suffix = match.group(2) if match else None
        if suffix in self.zero_keys:
            return torch.zeros(args.moe.n_experts)
        if suffix in self.expert_keys:
            try:
                return stack_experts(sources, len(self.expert_keys[suffix]), read, key)
            except ExpertKeyError as e:
                raise HFConversionError(str(e)) from e
        return self._reordered(key, read(sources[0]), args, to_hf=False)

    def from_hf(self, hf_state_dict: Mapping[str, torch.Tensor], args: Any) -> dict[str, torch.Tensor]:
        """HF state dict -> kenotron state dict that `model.load_state_dict(..., strict=True)` takes
        (`from_hf_sources` and `from_hf_tensor` over the whole dict). With tied embeddings
        `output.weight` is the embedding tensor itself."""
        sources = self.from_hf_sources(hf_state_dict, args)
        return {k: self.from_hf_tensor(k, s, hf_state_dict.__getitem__, args) for k, s in sources.items()}

    def _expert_of(self, hf_key: str) -> tuple[str, int, int] | None:
        """(kenotron key, expert, part) of a per-expert HF key, or None."""
        match = re.match(rf"^{re.escape(self.hf_layer_prefix)}\.(\d+)\.(.+)$", hf_key)
        if not match or not self.expert_keys:
            return None
        hit = match_expert_key(match.group(2), self.expert_keys)
        return None if hit is None else (f"layers.{match.group(1)}.{hit[0]}", hit[1], hit[2])

    def _layers_of(self, state: Mapping[str, Any]) -> list[str]:
        if not self.zero_keys:
            return []
        return sorted({m.group(1) for k in state if (m := _LAYER_KEY.match(k))}, key=int)


def _tied(args: Any) -> bool:
    return bool(args.tie_embeddings)


# -- helpers shared by the families' config translations ---------------------------------------


def rope_from_hf_config(config: Mapping[str, Any], default_theta: float) -> tuple[float, RopeScaling | None]:
    """(theta, Llama 3.1 scaling or None) from either transformers 5's `rope_parameters` or the
    older `rope_theta` + `rope_scaling` keys that published config.json files use."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", default_theta)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        return theta, RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_len=int(params["original_max_position_embeddings"]),
        )
    raise HFConversionError(
        f"rope type {rope_type!r} is not implemented in kenotron (it has 'default' and 'llama3'); "
        f"convert a checkpoint that uses one of those"
    )


def rope_to_hf_config(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """The `rope_theta` / `rope_scaling` keys (read by transformers 4.x and 5.x alike)."""
    out: dict[str, Any] = {"rope_theta": theta, "rope_scaling": None}
    if scaling is not None:
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_len,
        }
    return out


def require(config: Mapping[str, Any], key: str, expected: Any, why: str) -> None:
    """Stop when config.json sets `key` to something other than `expected` (absent is fine)."""
    value = config.get(key, expected)
    if value != expected:
        raise HFConversionError(f"config.json has {key}={value!r}; kenotron's model needs {expected!r} ({why})")


def head_dim_from_hf_config(config: Mapping[str, Any]) -> int:
    """The attention head size: `head_dim` when given, else hidden_size / num_attention_heads."""
    head_dim = config.get("head_dim")
    return int(head_dim) if head_dim else config["hidden_size"] // config["num_attention_heads"]


def decoder_fields_from_hf_config(config: Mapping[str, Any], *, tie_default: bool) -> dict[str, Any]:
    """The args fields every family here shares, from config.json's standard names."""
    n_heads = config["num_attention_heads"]
    return {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": n_heads,
        "n_kv_heads": config.get("num_key_value_heads") or n_heads,
        "ffn_dim": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
        "tie_embeddings": bool(config.get("tie_word_embeddings", tie_default)),
        "max_seq_len": config.get("max_position_embeddings", 4096),
    }


def hf_config_decoder_fields(args: Any) -> dict[str, Any]:
    """The reverse of `decoder_fields_from_hf_config` (plus head_dim, which every config takes)."""
    return {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.ffn_dim,
        "vocab_size": args.vocab_size,
        "tie_word_embeddings": args.tie_embeddings,
        "max_position_embeddings": args.max_seq_len,
    }


def require_derived_head_dim(config: Mapping[str, Any], family: str) -> None:
    """Stop when config.json's head_dim differs from hidden_size / num_attention_heads, for a
    family whose args derive the head size."""
    derived = config["hidden_size"] // config["num_attention_heads"]
    if head_dim_from_hf_config(config) != derived:
        raise HFConversionError(
            f"config.json has head_dim={config['head_dim']} but kenotron's {family} derives hidden_size / "
            f"num_attention_heads = {derived}; this checkpoint's shape is not supported by that family"
        )
