"""The archive's handler run in-process through TorchServe's own Python worker code (no Java, no sockets).

``TsModelLoader.load`` is what a TorchServe worker runs on the load command (it reads MAR-INF/MANIFEST.json and
imports the handler by the name the manifest gives), and ``Service.predict`` is what it runs per batch; the answer is
the worker's wire message (``create_predict_response``), decoded here into per-request status, Content-Type, body.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.model_loader import TsModelLoader
from ts.service import Service

from tests.inference_assets.archive_modules import forget_modules

ARCHIVE_MODULES = ("inference", "sentiment_serving")


@dataclass(frozen=True)
class WireAnswer:
    status: int
    phrase: str
    content_type: str
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@contextmanager
def loaded_service(model_dir: Path, *, batch_size: int = 8) -> Iterator[Service]:
    """The model loaded as a TorchServe worker loads it: handler from the manifest, ``code/`` on the path."""
    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    handler = manifest["model"]["handler"]
    handler_dir = str(model_dir / handler.split(":")[0].rsplit("/", 1)[0])  # what TorchServe puts on PYTHONPATH
    saved_path = list(sys.path)
    forget_modules(*ARCHIVE_MODULES)
    sys.path.insert(0, handler_dir)
    try:
        metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
        metrics.initialize_cache()
        service = TsModelLoader().load("model", str(model_dir), handler, None, batch_size, None, True, metrics)
        service.set_cl_socket(None)  # streaming answers only; a worker sets its socket here
        yield service
    finally:
        sys.path[:] = saved_path
        forget_modules(*ARCHIVE_MODULES)


def predict(service: Service, requests: Sequence[tuple[bytes | None, Mapping[str, str]]]) -> list[WireAnswer]:
    """One TorchServe batch: each request a (body, headers) pair, as the frontend sends it to the worker."""
    batch = []
    for index, (body, headers) in enumerate(requests):
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        parameters = [] if body is None else [{"name": "body", "contentType": content_type, "value": body}]
        batch.append(
            {
                "requestId": f"request-{index}".encode(),
                "parameters": parameters,
                "headers": [{"name": k.encode(), "value": v.encode()} for k, v in headers.items()],
            }
        )
    return decode(service.predict(batch))


def decode(message: bytes) -> list[WireAnswer]:
    """Decode ``ts.protocol.otf_message_handler.create_predict_response``'s bytes."""
    offset = 0

    def integer() -> int:
        nonlocal offset
        (value,) = struct.unpack_from("!i", message, offset)
        offset += 4
        return value

    def chunk() -> bytes:
        nonlocal offset
        length = integer()
        value = bytes(message[offset : offset + max(length, 0)])
        offset += max(length, 0)
        return value

    batch_code, _ = integer(), chunk()
    answers = []
    while True:
        request_id_length = integer()
        if request_id_length == -1:
            return answers
        offset += request_id_length
        content_type = chunk().decode()
        status = integer()
        phrase = chunk().decode()
        for _ in range(integer()):  # response headers
            chunk(), chunk()
        body = chunk()
        if batch_code != 200:  # the worker answered the whole batch with one code (the handler failed)
            status = batch_code
        answers.append(WireAnswer(status, phrase, content_type, body))
