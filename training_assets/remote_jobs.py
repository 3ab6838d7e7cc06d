"""Who owns an ``@remote`` job and where its objects live: one rule for the launcher policy (stacks/foundation.py)
and for the client that starts jobs (training_assets/remote_train.py).

Every caller works under ``<bucket>/jobs/<caller id>/`` of the RemoteJobs bucket and tags each training job with
``remote-job-owner=<caller id>``, where the caller id is IAM's ``aws:userid`` of the caller's credentials: for an
assumed role ``<role id>:<session name>`` (e.g. ``AROAEXAMPLE:alice@example.com``), for an IAM user its user id.
``aws sts get-caller-identity --query UserId`` prints the same value. The launcher policy names ``${aws:userid}``,
so a caller can neither read nor write another caller's objects, nor describe, stop or re-tag their jobs.
"""

from __future__ import annotations

import re

REMOTE_JOBS_PREFIX = "jobs"
OWNER_TAG_KEY = "remote-job-owner"
# IAM's policy variable for the caller's unique id (IAM User Guide, "IAM policy elements: Variables and tags").
CALLER_ID_VARIABLE = "${aws:userid}"
# SageMaker tag values (API Tag.Value): letters, spaces, digits and _.:/=+-@, at most 256 characters.
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]{1,256}$")


def caller_prefix(caller_id: str) -> str:
    """The caller's key prefix in the RemoteJobs bucket (no trailing slash)."""
    if not _TAG_VALUE.fullmatch(caller_id):
        raise ValueError(f"caller id {caller_id!r} cannot be a SageMaker tag value")
    return f"{REMOTE_JOBS_PREFIX}/{caller_id}"
