"""A stand-in for DJL Serving's ``djl_python`` Input/Output (not on PyPI; DJL Serving cannot run here).

It mirrors the subset of the real API the adapter uses, with the same names and semantics as
deepjavalibrary/djl-serving ``engines/python/setup/djl_python/{inputs,outputs}.py``: properties looked up
case-insensitively, content as (key, bytes) pairs, ``Output.error`` writing a JSON body with the code.
"""

from __future__ import annotations

import json
import types


class Input:
    def __init__(self, properties: dict[str, str] | None = None, body: bytes | None = None) -> None:
        self.properties = dict(properties or {})
        self.content: list[tuple[str, bytes]] = [] if body is None else [("data", bytes(body))]

    def get_properties(self) -> dict[str, str]:
        return self.properties

    def get_property(self, key: str) -> str | None:
        return next((v for k, v in self.properties.items() if k.lower() == key.lower()), None)

    def is_empty(self) -> bool:
        return not self.content

    def get_as_bytes(self, key: str | None = None) -> bytes | None:
        if not self.content:
            return None
        return dict(self.content).get(key or "data", self.content[0][1])

    def get_as_string(self, key: str | None = None) -> str:
        return self.get_as_bytes(key).decode("utf-8")

    def get_as_json(self, key: str | None = None) -> object:
        return json.loads(self.get_as_string(key))

    def is_batch(self) -> bool:
        return "batch_size" in self.properties

    def get_batches(self) -> list[Input]:
        """Split DJL's batch encoding: properties and content keys ``batch_NNN_<key>``."""
        if not self.is_batch():
            return [self]
        batch = [Input() for _ in range(int(self.properties["batch_size"]))]
        for key, value in self.properties.items():
            if key.startswith("batch_") and key != "batch_size":
                batch[int(key[6:9])].properties[key[10:]] = value
        for key, value in self.content:
            batch[int(key[6:9])].content.append((key[10:], value))
        return batch


def batched(requests: list[tuple[str, bytes]]) -> Input:
    """One DJL batch Input from (content type, body) pairs."""
    batch = Input({"batch_size": str(len(requests))})
    for index, (content_type, body) in enumerate(requests):
        batch.properties[f"batch_{index:03d}_Content-Type"] = content_type
        batch.content.append((f"batch_{index:03d}_data", body))
    return batch


class Output:
    def __init__(self, code: int = 200, message: str = "OK") -> None:
        self.code = code
        self.message = message
        self.properties: dict[str, str] = {}
        self.content: list[tuple[str | None, bytes]] = []

    def set_code(self, code: int) -> Output:
        self.code = code
        return self

    def set_message(self, message: str) -> Output:
        self.message = message
        return self

    def error(self, error: str, code: int = 424, message: str = "prediction failure") -> Output:
        self.code = code
        self.message = message
        self.add_property("content-type", "application/json")
        return self.add_as_json({"code": code, "message": message, "error": error})

    def add_property(self, key: str, val: str) -> Output:
        self.properties[key] = val
        return self

    def add(self, value: object, key: str | None = None, batch_index: int | None = None) -> Output:
        if batch_index is not None:
            key = f"batch_{batch_index}.{key or ''}"
        if isinstance(value, str):
            self.content.append((key, value.encode("utf-8")))
        elif isinstance(value, (bytes, bytearray)):
            self.content.append((key, bytes(value)))
        else:
            self.add_as_json(value, key=key)
        return self

    def add_as_json(self, val: object, key: str | None = None) -> Output:
        self.content.append((key, json.dumps(val, ensure_ascii=False, allow_nan=False).encode("utf-8")))
        return self

    def json(self, index: int = 0) -> object:
        return json.loads(self.content[index][1])


def module() -> types.ModuleType:
    fake = types.ModuleType("djl_python")
    fake.Input = Input
    fake.Output = Output
    return fake
