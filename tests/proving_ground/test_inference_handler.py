"""The TorchServe handler of the proving ground's multi-model harness (proving_ground/torchserve_mme/inference.py),
loaded and called in-process by TorchServe's own worker code.

``torchserve_inprocess`` runs ``TsModelLoader.load`` (handler taken from the archive's MAR-INF/MANIFEST.json) and
``Service.predict`` (one batch), and decodes the worker's wire answer: what the Java frontend would send per request.
The served behaviour behind the real toolkit + TorchServe is checked in tests/proving_ground/test_local_mme.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inference_assets.forward_passes import FAILURE, counted_forward_passes, failing_forward_passes
from tests.inference_assets.request_table import GOOD, REQUESTS, TEST_LIMITS, check_answer, headers
from tests.inference_assets.torchserve_inprocess import loaded_service, predict

LIMITS_ENV = TEST_LIMITS.environment()


@pytest.fixture(scope="module")
def service(torchserve_model: Path) -> Iterator:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LIMITS_ENV.items():
            patch.setenv(name, value)
        with loaded_service(torchserve_model, batch_size=64) as loaded:
            yield loaded


@pytest.fixture
def forward_passes(service) -> Iterator[list[int]]:
    """Record how many texts each forward pass of the loaded handler gets."""
    with counted_forward_passes(sys.modules["inference"].batch_handler) as sizes:
        yield sizes


def test_the_manifest_names_the_handler_torchserve_loads(torchserve_model: Path, service) -> None:
    manifest = json.loads((torchserve_model / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"] == {"modelName": "model", "handler": "code/inference.py:handle", "modelVersion": "1.0"}
    assert sys.modules["inference"].__file__ == str(torchserve_model / "code" / "inference.py")


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_each_request_alone(service, body, content_type, accept, status, fragment) -> None:
    (answer,) = predict(service, [(body, headers(content_type, accept))])
    check_answer(answer, status, fragment)


def test_the_whole_table_in_one_batch_is_one_forward_pass_with_per_request_answers(service, forward_passes) -> None:
    rows = [param.values for param in REQUESTS]
    batch = predict(service, [(body, headers(ct, accept)) for body, ct, accept, _, _ in rows])
    for answer, (_, _, _, status, fragment) in zip(batch, rows, strict=True):
        check_answer(answer, status, fragment)
    good_texts = sum(len(answer.json()) for answer in batch if answer.status == 200)
    assert forward_passes == [good_texts]
    # The same requests one by one give the same labels and (up to padding noise) the same scores.
    for answer, (body, ct, accept, status, _) in zip(batch, rows, strict=True):
        if status == 200:
            (alone,) = predict(service, [(body, headers(ct, accept))])
            assert [p["label"] for p in answer.json()] == [p["label"] for p in alone.json()]
            for got, want in zip(answer.json(), alone.json(), strict=True):
                assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


def test_a_batch_of_only_bad_requests_runs_no_forward_pass(service, forward_passes) -> None:
    answers = predict(service, [(b"{", {"Content-Type": "application/json"}), (b"x", {"Content-Type": "text/csv"})])
    assert [a.status for a in answers] == [400, 415]
    assert forward_passes == []


def test_a_request_without_a_body_parameter_is_a_client_error(service) -> None:
    """A form or multipart POST reaches the handler with named parameters and no "body"."""
    (answer,) = predict(service, [(None, {"Content-Type": "application/json"})])
    assert answer.status == 400 and "empty" in answer.json()["error"]


def test_a_failing_forward_pass_is_a_clean_500_and_the_worker_keeps_serving(service, caplog) -> None:
    with failing_forward_passes(sys.modules["inference"].batch_handler):
        answers = predict(service, [(b"fine", {"Content-Type": "text/plain"}), (b"", {"Content-Type": "text/plain"})])
    assert [a.status for a in answers] == [500, 400]
    assert "cheese" not in answers[0].body.decode() and "request-0" in answers[0].json()["error"]
    assert FAILURE in caplog.text
    body, ct, accept, _, _ = GOOD[0].values
    assert predict(service, [(body, headers(ct, accept))])[0].status == 200
