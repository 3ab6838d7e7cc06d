"""The model servers the multi-model endpoint can run; one list for the settings and the publishing tool."""

from __future__ import annotations

from typing import Literal, get_args

ModelServer = Literal["djl", "torchserve"]
MODEL_SERVERS: tuple[ModelServer, ...] = get_args(ModelServer)
DEFAULT_MODEL_SERVER: ModelServer = "djl"  # DJL Serving 0.36 (Python engine); TorchServe via the PyTorch DLC
