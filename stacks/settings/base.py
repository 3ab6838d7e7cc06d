"""What every area of the settings shares: the strict base model, the error that stops synth, and the checks of
instance types, S3 keys and patterns; ``describe_error`` turns pydantic's first error into the one sentence
``SettingsError`` carries."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from platform_facts.instances import InstanceType, lookup, names_where

DEFAULT_REGION = "us-west-2"

_ACCOUNT = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_S3_KEY = re.compile(r"^[A-Za-z0-9!_.*'()/-]+$")


def instance_facts(value: str, ml: bool, rule: Any, message: str) -> InstanceType:
    """The facts of ``value`` when it is an EC2 (``ml=False``) or SageMaker name that ``rule`` accepts; else
    ValueError with ``message`` (which names the allowed types)."""
    facts = lookup(value) if value.startswith("ml.") is ml else None
    if facts is None or not rule(facts):
        raise ValueError(message)
    return facts


def families_where(rule: Any) -> str:
    """The families with a type that ``rule`` accepts, for an error message."""
    return ", ".join(dict.fromkeys(name.split(".")[0] for name in names_where(rule)))


def matching(pattern: re.Pattern[str], message: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


AccountId = Annotated[str, matching(_ACCOUNT, "must be a 12-digit AWS account id in quotes")]
Region = Annotated[str, matching(_REGION, "must be an AWS region code such as us-west-2")]


class SettingsError(ValueError):
    """A setting in cdk.json is wrong; the message names the key and what is allowed."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def s3_key(value: str, *, prefix: bool) -> str:
    if value.startswith("/") or not _S3_KEY.match(value):
        raise ValueError("must be a relative S3 key of letters, digits and !_.*'()/- characters")
    if prefix and not value.endswith("/"):
        raise ValueError("must end with '/' (it is a prefix)")
    return value


def describe_error(error: Any, root: str, model: type[BaseModel]) -> str:
    """One sentence for pydantic's ``error`` under ``root`` of ``model``: the key's full path and what is allowed."""
    path = [str(part) for part in error["loc"]]
    key = ".".join([root, *path])
    if error["type"] == "extra_forbidden":
        for part in path[:-1]:
            annotation = model.model_fields[part].annotation
            model = next(
                a
                for a in (annotation, *getattr(annotation, "__args__", ()))
                if isinstance(a, type) and issubclass(a, BaseModel)
            )
        return f"{key}: unknown setting; allowed keys are {', '.join(sorted(model.model_fields))}."
    message = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    # A rule across settings names its key itself ("training.subnet_index: must be ...").
    if cross_setting := re.match(r"^([a-z_]+(?:\.[a-z_]+)+): (.*)$", message, re.DOTALL):
        key, message = f"{key}.{cross_setting[1]}", cross_setting[2]
    if error["type"] == "missing":
        message = "is required"
    return f"{key}: {message[0].lower()}{message[1:].rstrip('.')}."
