"""Session fixtures: models trained once per test run (nothing downloaded)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ptq_models import NetFiles


@pytest.fixture(scope="session")
def mobilenet_digits_files(tmp_path_factory: pytest.TempPathFactory) -> NetFiles:
    """The MobileNetV2-style digits network (tests/ptq_models.py), trained once, as ONNX + data."""
    pytest.importorskip("torch")
    from tests.ptq_models import mobilenet_digits

    return mobilenet_digits().save(tmp_path_factory.mktemp("mobilenet_digits"), "mobilenet_digits")


@pytest.fixture(scope="session")
def heavy_tailed_files(tmp_path_factory: pytest.TempPathFactory) -> NetFiles:
    """The digits CNN with a few rare, large activation channels (tests/ptq_models.py)."""
    from tests.ptq_models import DIGITS, heavy_tailed_digits

    folder = tmp_path_factory.mktemp("heavy_tailed")
    model = heavy_tailed_digits(folder / "heavy_tailed.onnx")
    test = np.load(DIGITS / "test.npz")
    return NetFiles(model, DIGITS / "calib.npz", DIGITS / "test.npz", test["x"], test["labels"])
