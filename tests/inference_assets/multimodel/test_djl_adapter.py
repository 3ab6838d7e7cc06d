"""The DJL adapter (model.py) run as DJL's Python engine runs it, with a stand-in for ``djl_python``.

model.py and serving.properties come out of the real DJL archive; every request of the shared request table
(tests/inference_assets/request_table.py) is also sent through the TorchServe archive's handler, run by TorchServe's own
worker code: both model servers must give the same status, Content-Type and body.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest

from inference_assets.container.contract import DjlModelSettings, Limits
from tests.inference_assets.archive_modules import forget_modules
from tests.inference_assets.multimodel import fake_djl_python
from tests.inference_assets.multimodel.fake_djl_python import Input, batched
from tests.inference_assets.multimodel.serving_properties import parse_properties
from tests.inference_assets.request_table import REQUESTS, TEST_LIMITS, headers
from tests.inference_assets.torchserve_inprocess import loaded_service, predict


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def djl(unpacked_djl_archive: Path):
    """model.py loaded the way DJL loads it; the first (empty) call initialises it from the properties."""
    saved_path = list(sys.path)
    forget_modules("sentiment_serving")
    sys.modules["djl_python"] = fake_djl_python.module()
    model = _import(unpacked_djl_archive / "model.py", "djl_model_under_test")
    assert model.handle(Input(_load_properties(unpacked_djl_archive))) is None  # the load call
    yield model
    forget_modules("djl_python", "djl_model_under_test", "sentiment_serving")
    sys.path[:] = saved_path


def _load_properties(model_dir: Path) -> dict[str, str]:
    """What DJL 0.36 hands the load call: every serving.properties key without ``option.``, plus the model dir."""
    properties = parse_properties((model_dir / "serving.properties").read_text())
    return {**{k.removeprefix("option."): v for k, v in properties.items()}, "model_dir": str(model_dir)}


@pytest.fixture(scope="module")
def torchserve(unpacked_torchserve_archive: Path):
    """The TorchServe archive's handler, run by TorchServe's worker code, with the DJL archive's limits."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in TEST_LIMITS.environment().items():
            patch.setenv(name, value)
        with loaded_service(unpacked_torchserve_archive, batch_size=64) as service:
            yield service


def _djl_answer(djl, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, object]:
    output = djl.handle(Input(headers, body or None))
    return output.code, output.properties.get("Content-Type"), output.json()


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_djl_and_torchserve_give_the_same_answer(djl, torchserve, body, content_type, accept, status, fragment):
    sent = headers(content_type, accept)
    djl_status, djl_type, djl_body = _djl_answer(djl, body, sent)
    (served,) = predict(torchserve, [(body, sent)])
    assert djl_status == served.status == status
    assert djl_type == served.content_type == "application/json"
    assert djl_body == served.json()  # same predictions, same error document
    if status != 200:
        assert djl_body["code"] == status and fragment in djl_body["error"]


def test_the_table_as_one_torchserve_batch_matches_the_djl_answers(djl, torchserve):
    rows = [param.values for param in REQUESTS]
    batch = predict(torchserve, [(body, headers(ct, accept)) for body, ct, accept, _, _ in rows])
    for served, (body, ct, accept, status, _) in zip(batch, rows, strict=True):
        djl_status, _, djl_body = _djl_answer(djl, body, headers(ct, accept))
        assert served.status == djl_status == status
        if status != 200:
            assert served.json() == djl_body
        else:
            assert [p["label"] for p in served.json()] == [p["label"] for p in djl_body]


def test_errors_keep_the_worker_serving(djl):
    bad = djl.handle(Input({"Content-Type": "application/json"}, b"not json"))
    assert (bad.code, bad.message, bad.properties["Content-Type"]) == (400, "Bad Request", "application/json")
    assert "not valid JSON" in bad.json()["error"]
    good = djl.handle(Input({"Content-Type": "application/json"}, b'{"inputs": "still here"}'))
    assert good.code == 200 and good.properties["Content-Type"] == "application/json"
    assert len(good.json()) == 1


def test_an_empty_request_after_the_load_call_is_a_400_not_another_load(djl):
    output = djl.handle(Input({"Content-Type": "application/json"}))
    assert output.code == 400 and "empty" in output.json()["error"]


@pytest.mark.parametrize(("content_type", "body", "status"), [("text/plain", b"fine", 200), ("text/plain", b" ", 400),
                                                             ("text/csv", b"a", 415)])  # fmt: skip
def test_a_batch_of_one_gets_its_own_status_and_content_type(djl, content_type, body, status):
    """With batch_size=1 in serving.properties DJL may still hand over a batch (of one request)."""
    output = djl.handle(batched([(content_type, body)]))
    assert (output.code, output.properties["Content-Type"]) == (status, "application/json")
    assert isinstance(output.json(), list) == (status == 200)


def test_a_dynamic_batch_of_several_requests_is_refused(djl):
    with pytest.raises(RuntimeError, match="batch_size must be 1"):
        djl.handle(batched([("text/plain", b"a"), ("text/plain", b"b")]))


def test_the_load_call_refuses_batch_size_above_one(unpacked_djl_archive):
    # The module's `djl` fixture keeps using what it imported: put it back afterwards (any test order).
    roots = ("djl_python", "sentiment_serving")
    saved_modules = {name: module for name, module in sys.modules.items() if name.split(".")[0] in roots}
    forget_modules("sentiment_serving")
    sys.modules["djl_python"] = fake_djl_python.module()
    saved_path = list(sys.path)
    # No other archive's code/ ahead of this one's (the module's TorchServe fixture holds its own on the path, and a
    # TorchServe archive carries no DJL adapter): as in DJL's worker, which has only this model's folders.
    sys.path[:] = [path for path in saved_path if not (Path(path) / "sentiment_serving").is_dir()]
    try:
        model = _import(unpacked_djl_archive / "model.py", "djl_model_batch_test")
        properties = {**_load_properties(unpacked_djl_archive), "batch_size": "4"}
        with pytest.raises(ValueError, match=r"batch_size=4: DJL Serving 0\.36 gives every request"):
            model.handle(Input(properties))
    finally:
        forget_modules("djl_python", "djl_model_batch_test", "sentiment_serving")
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path


def test_serving_properties_in_the_archive(unpacked_djl_archive):
    """The archive is built with the request table's limits and two workers
    (tests/inference_assets/multimodel/conftest.py); the rest are the contract's defaults."""
    properties = parse_properties((unpacked_djl_archive / "serving.properties").read_text())
    defaults = DjlModelSettings()
    assert properties == {
        "engine": "Python",
        "option.entryPoint": "model.py",
        "option.max_request_batch": str(TEST_LIMITS.max_request_batch),
        "option.max_request_bytes": str(TEST_LIMITS.max_request_bytes),
        "max_idle_time": str(defaults.max_idle_time_seconds),
        "batch_size": "1",
        "max_batch_delay": str(defaults.max_batch_delay_ms),
        "maxWorkers": "2",
    }
    assert (unpacked_djl_archive / "code" / "sentiment_serving" / "djl_adapter.py").is_file()
    assert (unpacked_djl_archive / "config.json").is_file()


def test_the_djl_archive_has_no_torchserve_manifest(djl_archive):
    """DJL Serving 0.36's Python engine (djl_python/service_loader.py load_model_service, tag v0.36.0) imports the
    entry point model.py only when the model directory has no MAR-INF/MANIFEST.json; with one it loads the
    manifest's handler through TorchServe's ts.model_loader instead, so a DJL archive must carry no MAR-INF/."""
    with tarfile.open(djl_archive) as tar:
        names = tar.getnames()
    assert {"model.py", "serving.properties"} <= set(names)
    assert [name for name in names if name.split("/")[0] == "MAR-INF"] == []
    assert "code/inference.py" not in names  # TorchServe's handler entry: nothing to name it without the manifest


def test_the_torchserve_archive_has_the_manifest_and_no_djl_files(torchserve_archive):
    with tarfile.open(torchserve_archive) as tar:
        names = set(tar.getnames())
        manifest = json.loads(tar.extractfile("MAR-INF/MANIFEST.json").read())
    assert manifest["model"]["handler"] == "code/inference.py:handle" and "code/inference.py" in names
    assert not names & {"model.py", "serving.properties"}


def test_serving_properties_render_every_setting():
    text = DjlModelSettings(min_workers=1, max_workers=8, max_idle_time_seconds=60, max_batch_delay_ms=20).render()
    assert parse_properties(text) == {
        "engine": "Python",
        "option.entryPoint": "model.py",
        "option.max_request_batch": str(Limits().max_request_batch),
        "option.max_request_bytes": str(Limits().max_request_bytes),
        "max_idle_time": "60",
        "batch_size": "1",
        "max_batch_delay": "20",
        "minWorkers": "1",
        "maxWorkers": "8",
    }
    assert "minWorkers" not in DjlModelSettings().render()  # unset bounds stay DJL's (hardware-derived)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_workers": 4, "max_workers": 2}, r"min_workers \(4\) must not exceed max_workers \(2\)"),
        ({"min_workers": 3, "max_workers": 2}, r"min_workers \(3\) must not exceed max_workers \(2\)"),
        ({"min_workers": 0}, "min_workers must be an integer from 1 to 128, got 0"),
        ({"max_idle_time_seconds": 0}, "max_idle_time_seconds must be an integer from 1"),
        ({"batch_size": 2.5}, "batch_size must be 1 for DJL Serving"),
        ({"batch_size": 4}, "batch_size must be 1 for DJL Serving, got 4: DJL 0.36 gives every request"),
        ({"max_request_bytes": 100}, "max_request_bytes must be an integer from 1024"),
        ({"max_batch_delay_ms": -1}, "max_batch_delay_ms must be an integer from 0"),
        ({"max_workers": True}, "max_workers must be an integer"),
    ],
)
def test_bad_settings_are_refused_with_the_rule(settings, message):
    with pytest.raises(ValueError, match=message):
        DjlModelSettings(**settings)


def test_equal_worker_bounds_are_accepted():
    assert "minWorkers=2\nmaxWorkers=2" in DjlModelSettings(min_workers=2, max_workers=2).render()


def test_parse_properties_refuses_lines_without_a_value():
    with pytest.raises(ValueError, match="line 2 is not key=value"):
        parse_properties("engine=Python\njust words\n")
