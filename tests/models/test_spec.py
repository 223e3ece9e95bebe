"""ModelSpec names its family's model class and HF adapter by import paths, imported on first use."""

from __future__ import annotations

import pytest
from torch import nn

from kenotron.models import MODEL_SPECS, ModelSpec
from kenotron.models.hf_adapter import HFAdapter
from kenotron.models.llama3 import LLAMA3_FLAVORS


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_every_family_names_its_own_model_class_and_hf_adapter(name):
    spec = MODEL_SPECS[name]
    assert issubclass(spec.model_cls, nn.Module)
    assert spec.model_cls.__module__ == f"kenotron.models.{name}.model"
    assert isinstance(spec.hf_adapter, HFAdapter)
    assert spec.hf_adapter_path.startswith(f"kenotron.models.{name}.hf:")


def test_a_family_without_hf_adapter_reads_none():
    spec = ModelSpec(name="toy", model_cls_path="kenotron.models.llama3.model:Llama3", flavors=LLAMA3_FLAVORS)
    assert spec.hf_adapter is None


@pytest.mark.parametrize("field, path", [
    ("model_cls_path", "kenotron.models.llama3.model.Llama3"),  # a dot for the colon
    ("hf_adapter_path", "kenotron.models.llama3.hf"),
])
def test_an_import_path_without_module_and_attribute_is_refused_when_the_spec_is_made(field, path):
    paths = {"model_cls_path": "kenotron.models.llama3.model:Llama3", field: path}
    with pytest.raises(ValueError, match=f"{field}='{path}' is not an import path; write 'package.module:attribute'"):
        ModelSpec(name="toy", flavors=LLAMA3_FLAVORS, **paths)
