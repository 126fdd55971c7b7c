"""Tests of how the op library is found and loaded."""

import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import _loader


@pytest.mark.parametrize("installed", ["2.20.1", "2.22.0", "3.0.0"])
def test_other_tensorflow_versions_get_a_clear_error(installed):
    with pytest.raises(
        pe.TensorFlowVersionError, match=rf"TensorFlow {pe.REQUIRED_TENSORFLOW}\.x.*{installed}"
    ):
        _loader._check_tensorflow_version(installed)


def test_installed_tensorflow_is_the_required_one():
    _loader._check_tensorflow_version(tf.__version__)
    assert tf.__version__.startswith(pe.REQUIRED_TENSORFLOW + ".")


def test_library_loads_once_and_registers_the_op():
    first = _loader.load_ops()
    assert _loader.load_ops() is first
    assert hasattr(first, "partial_embedding_masked_scatter_sub")


def test_missing_library_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(_loader, "_library", None)
    monkeypatch.setattr(_loader, "library_path", lambda: str(tmp_path / "absent.so"))
    with pytest.raises(ImportError, match="pip install"):
        _loader.load_ops()
