"""The streamed HF -> kenotron conversion (kenotron/checkpoint/hf_import.py): for every family with
an HF adapter it writes exactly the checkpoint that converting the whole state dict in memory
writes (the same keys in the same order, metadata, bytes of every tensor) and gives back the
model it was exported from; and it never holds more than about one tensor and its sources."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import safetensors
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp

from kenotron.checkpoint.folders import check_checkpoint
from kenotron.checkpoint.hf import hf_to_checkpoint, save_hf
from kenotron.checkpoint.hf_files import read_hf_config, weight_files
from kenotron.checkpoint.hf_import import HFWeights, spec_for_hf_config
from kenotron.models import MODEL_SPECS, get_model_spec
from kenotron.models.llama3 import Llama3Args
from kenotron.models.mamba2 import Mamba2Args
from tests.models.deepseek_v3.test_hf import SMALL as DEEPSEEK_V3_SMALL
from tests.models.hf_parity import random_kenotron_model
from tests.models.test_hf_parity import SMALL as DENSE_SMALL
from tests.models.test_moe_families import small_args as moe_small_args

SMALL = {
    "llama3": Llama3Args(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=128, max_seq_len=32),
    # Two groups: the in-projection's and convolution's rows are regrouped on import.
    "mamba2": Mamba2Args(dim=64, n_layers=2, vocab_size=128, ssm_state=16, ssm_head_dim=16, ssm_groups=2,
                         chunk_size=16, max_seq_len=32),
    **DENSE_SMALL,
    **{family: moe_small_args(family) for family in ("qwen3_moe", "mixtral", "qwen2_moe")},
    "deepseek_v3": dataclasses.replace(DEEPSEEK_V3_SMALL, max_seq_len=32),  # MLA, dense first block, MTP
}
CASES = [(family, None) for family in sorted(SMALL)] + [
    ("llama3-tied", None), ("mamba2", torch.bfloat16), ("qwen3_moe", torch.bfloat16), ("llama3-tied", torch.bfloat16),
]


def _spec_and_args(case: str):
    family, _, variant = case.partition("-")
    args = SMALL[family]
    return get_model_spec(family), dataclasses.replace(args, tie_embeddings=True) if variant == "tied" else args


def _load(path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(DCP's metadata of every key, in the file's order; every tensor of the checkpoint)."""
    items = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in items.items()}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return dict(items), state


def _in_memory_conversion(hf_dir, out, dtype) -> None:
    """What `kenotron convert to-kenotron` did before it streamed: every HF tensor loaded, the whole
    state dict converted (`from_hf`), then one `dcp.save`."""
    config = read_hf_config(hf_dir)
    spec = spec_for_hf_config(config)
    args = spec.hf_adapter.args_from_hf_config(config, max_seq_len=32)
    files = weight_files(hf_dir)  # {HF key: its file}, in the folder's index order
    loaded = {path: safetensors.torch.load_file(path) for path in set(files.values())}
    hf_state = {key: loaded[path][key] for key, path in files.items()}
    state = spec.hf_adapter.from_hf(hf_state, args)
    state = {k: v.to(dtype) for k, v in state.items()} if dtype is not None else state
    dcp.save({"model": state}, checkpoint_id=str(out), no_dist=True)


def test_every_family_with_an_hf_adapter_is_covered():
    assert set(SMALL) == {name for name, spec in MODEL_SPECS.items() if spec.hf_adapter is not None}


@pytest.mark.parametrize(("case", "dtype"), CASES, ids=[f"{c}-{str(d).removeprefix('torch.')}" for c, d in CASES])
def test_streamed_checkpoint_equals_the_in_memory_conversion_and_the_exported_model(case, dtype, tmp_path):
    spec, args = _spec_and_args(case)
    model = random_kenotron_model(spec, args)
    save_hf(model, tmp_path / "hf", spec=spec, args=args, max_shard_bytes=20_000)  # several shards, experts split
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 2
    out = hf_to_checkpoint(tmp_path / "hf", tmp_path / "ckpt", step=5, dtype=dtype, max_seq_len=32)
    _in_memory_conversion(tmp_path / "hf", tmp_path / "reference", dtype)

    streamed_meta, streamed = _load(out)
    reference_meta, reference = _load(tmp_path / "reference")
    assert list(streamed_meta) == list(reference_meta)  # the same keys, in the same order
    for key, item in reference_meta.items():
        assert streamed_meta[key] == item, key  # size, dtype, chunks
        assert torch.equal(streamed[key], reference[key]), key
    # Not the file's bytes: they equal the reference's on torch 2.13, but torch 2.11's own writer lays
    # out the same records with other bytes (both read back to the tensors compared above).
    exported = {f"model.{k}": v for k, v in model.state_dict().items()}
    assert set(streamed) == set(exported)
    for key, value in exported.items():
        assert torch.equal(streamed[key], value.to(dtype or value.dtype)), key
    marker, _ = check_checkpoint(out)
    assert marker["step"] == 5 and marker["dtype"] == str(next(iter(reference.values())).dtype).removeprefix("torch.")


class LiveBytes:
    """Bytes of the CPU storages it was shown that are still alive, and their peak (a storage
    counts once, however many tensors view it, until its last one is dropped)."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self._live: set[int] = set()

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if tensor.device.type == "cpu" and storage.data_ptr() not in self._live:
            self._live.add(storage.data_ptr())
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
            weakref.finalize(storage, self._free, storage.data_ptr(), storage.nbytes())
        return tensor

    def _free(self, ptr: int, nbytes: int) -> None:
        self._live.discard(ptr)
        self.now -= nbytes


class _TrackedSlice:
    def __init__(self, inner, live: LiveBytes) -> None:
        self._inner, self._live = inner, live

    def get_shape(self):
        return self._inner.get_shape()

    def get_dtype(self):
        return self._inner.get_dtype()

    def __getitem__(self, index):
        return self._live.track(self._inner[index])


def _track_safetensors_reads(monkeypatch, live: LiveBytes) -> None:
    """Every tensor read from a safetensors file (a lazy slice or a whole tensor) counts in `live`."""
    real_open = safetensors.safe_open

    class TrackedOpen:
        def __init__(self, *args, **kwargs) -> None:
            self._inner = real_open(*args, **kwargs)

        def __enter__(self):
            self._handle = self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

        def keys(self):
            return self._handle.keys()

        def get_slice(self, key):
            return _TrackedSlice(self._handle.get_slice(key), live)

        def get_tensor(self, key):
            return live.track(self._handle.get_tensor(key))

    monkeypatch.setattr(safetensors, "safe_open", TrackedOpen)


@pytest.mark.parametrize(("family", "dtype"), [("llama3", None), ("qwen3_moe", None), ("mamba2", torch.bfloat16)])
def test_conversion_holds_a_tensor_and_its_sources_never_the_model(family, dtype, tmp_path, monkeypatch):
    spec = get_model_spec(family)
    args = dataclasses.replace(SMALL[family], n_layers=16)
    model = random_kenotron_model(spec, args)
    save_hf(model, tmp_path / "hf", spec=spec, args=args, max_shard_bytes=200_000)
    state = model.state_dict()
    total = sum(v.nbytes for v in state.values())
    largest = max(v.nbytes for v in state.values())  # fp32 here: no converted tensor is larger
    del model, state

    live = LiveBytes()
    _track_safetensors_reads(monkeypatch, live)
    built = HFWeights.tensor
    monkeypatch.setattr(HFWeights, "tensor", lambda self, *a, **k: live.track(built(self, *a, **k)))
    hf_to_checkpoint(tmp_path / "hf", tmp_path / "ckpt", dtype=dtype, max_seq_len=32)

    # What was read and what was built from it, alive at once: one tensor and its sources at most
    # (a cast or regrouped copy doubles it), though the whole model was read in all.
    assert live.now == 0 and len(list((tmp_path / "hf").glob("*.safetensors"))) >= 4
    assert live.peak <= 2 * largest < total / 10, (live.peak, largest, total)


@pytest.fixture
def llama_hf_folder(tmp_path):
    spec, args = get_model_spec("llama3"), SMALL["llama3"]
    save_hf(random_kenotron_model(spec, args), tmp_path / "hf", spec=spec, args=args)
    return tmp_path / "hf"


def _edit_config(hf_dir, **changes) -> None:
    import json

    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("changes, message", [
    ({"num_hidden_layers": 3}, r"config.json describes 3 layers but the weights hold 2 \(model.layers.0 to .1\)"),
    ({"num_hidden_layers": 100_000}, r"config.json describes 100000 layers but the weights hold 2"),
    ({"hidden_size": 1_000_000, "head_dim": 250_000},
     (r"config.json describes a vocabulary of 128 and a width of 1000000 but model.embed_tokens.weight has shape "
      r"\(128, 64\); fix config.json")),
])
@pytest.mark.parametrize("entry", ["convert", "load"])
def test_an_hf_config_that_does_not_describe_its_weights_is_refused_before_anything_is_built(
        llama_hf_folder, tmp_path, changes, message, entry):
    import time

    from kenotron.checkpoint.errors import CheckpointMismatchError
    from kenotron.checkpoint.hf import load_hf_model

    _edit_config(llama_hf_folder, **changes)
    start = time.perf_counter()
    with pytest.raises(CheckpointMismatchError, match=message) as err:
        if entry == "convert":
            hf_to_checkpoint(llama_hf_folder, tmp_path / "out")
        else:
            load_hf_model(llama_hf_folder)
    assert time.perf_counter() - start < 1.0 and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_model_larger_than_the_host_memory_is_refused_before_it_is_allocated(llama_hf_folder):
    from kenotron.checkpoint.errors import CheckpointFormatError
    from kenotron.checkpoint.hf_files import StoredWeight
    from kenotron.checkpoint.hf_import import check_memory

    huge = {"w": StoredWeight(llama_hf_folder / "model.safetensors", (1 << 40,), torch.float32)}  # 4 TiB as float32
    with pytest.raises(CheckpointFormatError, match=r"needs 4096.0 GiB of host memory to load, [\d.]+ GiB are available"):
        check_memory(llama_hf_folder, huge, 4)
