"""The trainer computes in full FP32 (no TensorFloat-32) and gives the caller's TF32 settings back
(fedsim.training.precision). The flags are plain process state, so all of this runs on a CPU."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsim.data import build_federated_data
from fedsim.models import MODEL_FACTORIES
from fedsim.training import precision
from fedsim.training.precision import full_fp32
from fedsim.training.trainer import ClientPlan, ClientTrainer, TrainSettings, initial_weights

NEW_API = bool(precision._precision_flags())


def _read(get):
    try:
        return get()
    except RuntimeError:  # PyTorch >= 2.9 refuses to read a legacy setting set apart from the new ones
        return "refused"


def _settings() -> tuple:
    """Every TF32 setting as it stands: the legacy ones and, where PyTorch has them, the fp32_precision ones."""
    legacy = (
        _read(lambda: torch.backends.cudnn.allow_tf32),
        _read(lambda: torch.backends.cuda.matmul.allow_tf32),
        _read(torch.get_float32_matmul_precision),
    )
    return legacy + tuple(f.fp32_precision for f in precision._precision_flags())


def _tf32_allowed() -> tuple[bool, bool]:
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


@pytest.fixture
def restore_settings():
    """The process's TF32 settings put back after the test, whatever it did."""
    flags = precision._precision_flags()
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    strings = [f.fp32_precision for f in flags]
    yield
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision(matmul)
    for f, value in zip(flags, strings, strict=True):
        f.fp32_precision = value


@pytest.fixture
def caller_allows_tf32(restore_settings):
    """A caller that allows TF32 for cuDNN and cuBLAS (PyTorch's default allows it for cuDNN only)."""
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    assert _tf32_allowed() == (True, True)
    return _settings()


def test_full_fp32_turns_tf32_off_inside_and_gives_the_callers_settings_back(caller_allows_tf32):
    with full_fp32():
        assert _tf32_allowed() == (False, False)
        with full_fp32():  # nested, as a trainer method called by another one
            assert _tf32_allowed() == (False, False)
        assert _tf32_allowed() == (False, False)
    assert _tf32_allowed() == (True, True)
    assert _settings() == caller_allows_tf32


def test_full_fp32_gives_the_settings_back_after_an_exception(caller_allows_tf32):
    with pytest.raises(RuntimeError, match="the user's model failed"), full_fp32():
        assert _tf32_allowed() == (False, False)
        raise RuntimeError("the user's model failed")
    assert _settings() == caller_allows_tf32


@pytest.mark.skipif(not NEW_API, reason="PyTorch < 2.9 has no fp32_precision settings")
def test_full_fp32_restores_settings_made_with_the_new_api_that_the_legacy_ones_cannot_read(restore_settings):
    conv, rnn, matmul = torch.backends.cudnn.conv, torch.backends.cudnn.rnn, torch.backends.cuda.matmul
    conv.fp32_precision, rnn.fp32_precision, matmul.fp32_precision = "tf32", "ieee", "tf32"
    before = _settings()
    assert before[:3] == ("refused",) * 3  # the caller mixed the APIs: the legacy settings cannot be read
    with full_fp32():
        assert (conv.fp32_precision, rnn.fp32_precision, matmul.fp32_precision) == ("ieee",) * 3
    assert _settings() == before


@pytest.mark.parametrize("vectorize", ["auto", "loop"])
def test_the_trainer_checks_trains_and_evaluates_without_tf32_and_leaves_the_caller_s_settings(
    caller_allows_tf32, vectorize
):
    seen: list[tuple[bool, bool]] = []

    def loss(outputs, targets):  # called by the path check, every training step and evaluation
        seen.append(_tf32_allowed())
        return F.cross_entropy(outputs, targets, reduction="none")

    # synthetic clients need no partitioner (flwr-datasets): the test runs on a bare GPU image too
    data = build_federated_data(
        "synthetic", num_clients=6, heldout_fraction=0.0, synthetic_alpha=1, synthetic_beta=1, seed=0
    )
    s = TrainSettings(
        model=MODEL_FACTORIES["mlp"], model_kwargs={"hidden": [8]}, seed=0, vectorize=vectorize, loss=loss
    )
    trainer = ClientTrainer(data, s, device="cpu")
    assert trainer.path.name == ("loop" if vectorize == "loop" else "per-layer")
    assert _settings() == caller_allows_tf32
    w = initial_weights(s, data.input_shape, data.num_classes)
    calls = {
        "train": lambda: trainer.train(ClientPlan(1, np.arange(6), 1.0, loss_bound=5.0), w),
        "train_one": lambda: trainer.train_one(0, 1, torch.as_tensor(w, dtype=torch.float32)),
        "evaluate": lambda: trainer.evaluate(np.arange(6), w),
    }
    for name, call in calls.items():
        seen.clear()
        call()
        assert seen and set(seen) == {(False, False)}, name
        assert _settings() == caller_allows_tf32, name
