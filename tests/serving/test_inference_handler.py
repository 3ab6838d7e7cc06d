"""code/inference.py in-process, loaded from the unpacked archive the way the toolkit imports it (code/ on the path).

The toolkit turns a BaseInferenceToolkitError into its status code and anything else into 500, so each client
mistake must surface as a GenericInferenceToolkitError with the right 4xx (the served behaviour is checked in
test_toolkit_server.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from sagemaker_inference.errors import GenericInferenceToolkitError


@pytest.fixture(scope="module")
def handler(unpacked_model: Path) -> ModuleType:
    code = str(unpacked_model / "code")
    sys.path.insert(0, code)
    try:
        spec = importlib.util.spec_from_file_location("archive_inference", unpacked_model / "code" / "inference.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(code)


@pytest.fixture(scope="module")
def predictor(handler: ModuleType, unpacked_model: Path):
    return handler.model_fn(str(unpacked_model))


def status_of(call) -> int:
    with pytest.raises(GenericInferenceToolkitError) as error:
        call()
    return error.value.status_code


def test_json_and_text_bodies_parse_to_inputs(handler: ModuleType) -> None:
    assert handler.input_fn('{"inputs": "one"}', "application/json") == "one"
    assert handler.input_fn(b'{"inputs": ["a", "b"]}', "application/json; charset=utf-8") == ["a", "b"]
    assert handler.input_fn(b"plain words", "text/plain") == "plain words"


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ("{", "application/json", 400),
        ('{"input": "x"}', "application/json", 400),
        ("null", "application/json", 400),
        (b"\xc3\x28", "text/plain", 400),
        ("", "text/plain", 400),
        ("x", "application/xml", 415),
        ("x", None, 415),
        ("x", "text/plain; charset=utf-16", 415),
    ],
)
def test_bad_bodies_map_to_their_status(handler: ModuleType, body, content_type, status: int) -> None:
    assert status_of(lambda: handler.input_fn(body, content_type)) == status


def test_predict_maps_predictor_errors(handler: ModuleType, predictor) -> None:
    assert status_of(lambda: handler.predict_fn([], predictor)) == 400
    assert status_of(lambda: handler.predict_fn(["ok", None], predictor)) == 400
    assert status_of(lambda: handler.predict_fn(["x"] * (predictor.max_batch_size + 1), predictor)) == 413
    (prediction,) = handler.predict_fn("fine", predictor)
    assert set(prediction) == {"label", "score", "scores"}


def test_output_is_json_unless_the_client_refuses_it(handler: ModuleType) -> None:
    body, content_type = handler.output_fn([{"label": "neutral"}], "application/json")
    assert (json.loads(body), content_type) == ([{"label": "neutral"}], "application/json")
    assert status_of(lambda: handler.output_fn([], "text/html, text/csv")) == 406


def test_the_batch_limit_comes_from_the_environment(
    handler: ModuleType, unpacked_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(handler.MAX_REQUEST_BATCH_ENV, "3")
    assert handler.model_fn(str(unpacked_model)).max_batch_size == 3
    for bad in ("0", "many"):
        monkeypatch.setenv(handler.MAX_REQUEST_BATCH_ENV, bad)
        with pytest.raises(ValueError, match="must be a positive integer"):
            handler.model_fn(str(unpacked_model))
