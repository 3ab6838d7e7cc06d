"""The names of what the platform builds for its own images: one ECR repository per image in the tooling account, and
one SSM parameter per image in each environment holding the digest URI the pipeline promoted there.

The one place these names are made. No CDK here: the constructs (components/image_builds.py, pipeline.py) and the
post-synth IAM analysers (scripts/iam_analysers.py, which resolve a template's image parameter to the digest URI it
would hold) both read them.
"""

from __future__ import annotations

import re

# The parameter's name, which both image_parameter_name and image_of_parameter read (it holds no character special
# to a regular expression).
_PARAMETER = "/{project}/images/{image}"
_PARAMETER_PATTERN = re.compile("^" + _PARAMETER.format(project="(?P<project>[^/]+)", image="(?P<image>[^/]+)") + "$")


def image_repository_name(project: str, image: str) -> str:
    """The ECR repository of ``image`` in the tooling account (a fixed name: environments in other accounts pull
    from it by ARN)."""
    return f"{project}/{image}"


def image_parameter_name(project: str, image: str) -> str:
    """The SSM parameter, in each environment's account and region, holding the digest URI of ``image`` that the
    pipeline promoted to that environment."""
    return _PARAMETER.format(project=project, image=image)


def image_of_parameter(name: str) -> tuple[str, str] | None:
    """(project, image) of an image parameter's name (the inverse of ``image_parameter_name``); None for any other
    name."""
    match = _PARAMETER_PATTERN.match(name)
    return (match["project"], match["image"]) if match else None
