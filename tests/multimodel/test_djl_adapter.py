"""The DJL adapter (model.py) run as DJL's Python engine runs it, with a stand-in for ``djl_python``.

model.py and serving.properties come out of the real archive; each request is also sent through the toolkit
handler (code/inference.py) of the same archive: both model servers must give the same answers.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from sagemaker_inference.errors import BaseInferenceToolkitError

from inference_assets.tools.serving_properties import DjlModelSettings, parse_properties

from . import fake_djl_python
from .fake_djl_python import Input, batched


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forget(*modules: str) -> None:
    """Drop modules imported from the unpacked archive, so later tests import their own copies."""
    for name in list(sys.modules):
        if name in modules or name.split(".")[0] in modules:
            sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def djl(unpacked_mme_archive: Path):
    """model.py loaded the way DJL loads it; the first (empty) call initialises it from the properties."""
    saved_path = list(sys.path)
    sys.modules["djl_python"] = fake_djl_python.module()
    model = _import(unpacked_mme_archive / "model.py", "djl_model_under_test")
    properties = parse_properties((unpacked_mme_archive / "serving.properties").read_text())
    # DJL hands the Python engine the model directory and the option.* settings without their prefix.
    init = {k.removeprefix("option."): v for k, v in properties.items() if k.startswith("option.")}
    assert model.handle(Input({**init, "model_dir": str(unpacked_mme_archive)})) is None  # the load call
    yield model
    _forget("djl_python", "djl_model_under_test", "sentiment_serving")
    sys.path[:] = saved_path


@pytest.fixture(scope="module")
def toolkit(unpacked_mme_archive: Path):
    """The toolkit handler of the same archive, with the request limit the archive gives DJL (4 texts)."""
    saved_path = list(sys.path)
    sys.path.insert(0, str(unpacked_mme_archive / "code"))
    handler = _import(unpacked_mme_archive / "code" / "inference.py", "toolkit_handler_under_test")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(handler.MAX_REQUEST_BATCH_ENV, "4")  # the toolkit takes it from the container environment
        predictor = handler.model_fn(str(unpacked_mme_archive))
    yield handler, predictor
    _forget("toolkit_handler_under_test", "sentiment_serving")
    sys.path[:] = saved_path


def _djl_answer(djl, content_type: str, body: bytes) -> tuple[int, object]:
    output = djl.handle(Input({"Content-Type": content_type}, body))
    return output.code, output.json()


def _toolkit_answer(toolkit, content_type: str, body: bytes) -> tuple[int, object]:
    handler, predictor = toolkit
    try:
        texts = handler.input_fn(body, content_type)
        answer, _ = handler.output_fn(handler.predict_fn(texts, predictor), "application/json")
    except BaseInferenceToolkitError as error:
        return error.status_code, error.message
    return 200, json.loads(answer)


REQUESTS = [
    ("application/json", b'{"inputs": ["great day", "awful service"]}', 200),
    ("application/json", b'{"inputs": "just one text"}', 200),
    ("application/json; charset=utf-8", '{"inputs": "café ☕"}'.encode(), 200),
    ("text/plain", b"a plain text request", 200),
    ("application/json", b'{"inputs": ', 400),
    ("application/json", b'{"text": "wrong key"}', 400),
    ("application/json", b'{"inputs": []}', 400),
    ("application/json", b'{"inputs": ["ok", 7]}', 400),
    ("application/json", b"\xff\xfe not utf-8", 400),
    ("text/plain", b"   ", 400),
    ("application/json", json.dumps({"inputs": ["t"] * 5}).encode(), 413),  # max_request_batch=4 in the archive
    ("application/xml", b"<inputs>no</inputs>", 415),
    ("application/json; charset=latin-1", b'{"inputs": "x"}', 415),
]


@pytest.mark.parametrize(("content_type", "body", "status"), REQUESTS)
def test_djl_and_toolkit_give_the_same_answer(djl, toolkit, content_type, body, status):
    djl_status, djl_body = _djl_answer(djl, content_type, body)
    toolkit_status, toolkit_body = _toolkit_answer(toolkit, content_type, body)
    assert djl_status == toolkit_status == status
    if status == 200:
        assert djl_body == toolkit_body
        assert [set(p) for p in djl_body] == [{"label", "score", "scores"}] * len(djl_body)
        assert {p["label"] for p in djl_body} <= {"negative", "neutral", "positive"}
    else:
        assert djl_body["code"] == status and djl_body["error"]  # a JSON error that says what is wrong


def test_success_is_json_and_errors_keep_the_worker_serving(djl):
    bad = djl.handle(Input({"Content-Type": "application/json"}, b"not json"))
    assert (bad.code, bad.properties["content-type"]) == (400, "application/json")
    assert "not valid JSON" in bad.json()["error"]
    good = djl.handle(Input({"Content-Type": "application/json"}, b'{"inputs": "still here"}'))
    assert good.code == 200 and good.properties["Content-Type"] == "application/json"
    assert len(good.json()) == 1


def test_a_dynamic_batch_answers_each_request_and_isolates_bad_ones(djl):
    output = djl.handle(
        batched([("application/json", b'{"inputs": ["a", "b"]}'), ("text/plain", b""), ("text/plain", b"c")])
    )
    assert output.code == 200
    answers = {key: json.loads(value) for key, value in output.content}
    assert list(answers) == ["batch_0.data", "batch_1.data", "batch_2.data"]
    assert len(answers["batch_0.data"]) == 2 and len(answers["batch_2.data"]) == 1
    assert answers["batch_1.data"]["code"] == 400


def test_serving_properties_in_the_archive(unpacked_mme_archive):
    properties = parse_properties((unpacked_mme_archive / "serving.properties").read_text())
    assert properties == {
        "engine": "Python",
        "option.entryPoint": "model.py",
        "option.max_request_batch": "4",
        "max_idle_time": "600",
        "batch_size": "1",
        "max_batch_delay": "100",
        "maxWorkers": "2",
    }
    assert (unpacked_mme_archive / "code" / "inference.py").is_file()
    assert (unpacked_mme_archive / "config.json").is_file()


def test_serving_properties_render_every_setting():
    text = DjlModelSettings(min_workers=1, max_workers=8, max_idle_time_seconds=60, batch_size=4,
                            max_batch_delay_ms=20).render()  # fmt: skip
    assert parse_properties(text) == {
        "engine": "Python",
        "option.entryPoint": "model.py",
        "option.max_request_batch": "32",
        "max_idle_time": "60",
        "batch_size": "4",
        "max_batch_delay": "20",
        "minWorkers": "1",
        "maxWorkers": "8",
    }
    assert "minWorkers" not in DjlModelSettings().render()  # unset bounds stay DJL's (hardware-derived)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_workers": 4, "max_workers": 2}, r"min_workers \(4\) must not exceed max_workers \(2\)"),
        ({"min_workers": 0}, "min_workers must be an integer from 1 to 128, got 0"),
        ({"max_idle_time_seconds": 0}, "max_idle_time_seconds must be an integer from 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"max_batch_delay_ms": -1}, "max_batch_delay_ms must be an integer from 0"),
        ({"max_workers": True}, "max_workers must be an integer"),
    ],
)
def test_bad_settings_are_refused_with_the_rule(settings, message):
    with pytest.raises(ValueError, match=message):
        DjlModelSettings(**settings)


def test_parse_properties_refuses_lines_without_a_value():
    with pytest.raises(ValueError, match="line 2 is not key=value"):
        parse_properties("engine=Python\njust words\n")
