"""Suite-wide switches: GPU layers skip without CUDA unless --require-gpu turns skips into failures."""

from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail (instead of skip) tests marked gpu when no CUDA device is present",
    )
    parser.addoption(
        "--budget-gpu",
        metavar="NAME",
        help="hold the perf layer to this GPU's rows of parity/budgets.toml (A100, H100, H200) "
        "instead of the rows of the GPU found",
    )


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    require = config.getoption("--require-gpu")
    for item in items:
        if "gpu" not in item.keywords:
            continue
        if require:
            item.add_marker(pytest.mark.usefixtures("_fail_without_gpu"))
        else:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none found); run on a GPU runner or with --require-gpu to fail instead"))


@pytest.fixture
def _fail_without_gpu():
    pytest.fail("--require-gpu was given but torch.cuda.is_available() is False")


@pytest.fixture(scope="session")
def data_root():
    from parity.settings import DataNotFoundError, data_root

    try:
        return data_root()
    except DataNotFoundError as err:
        pytest.skip(str(err))
