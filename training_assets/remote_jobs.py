"""Who owns an ``@remote`` job and where its objects live: one rule for the Foundation's per-caller roles and
policies (stacks/components/remote_job_launcher.py, stacks/components/sagemaker_roles.py) and for the client that
starts jobs (training_assets/remote_train.py).

Every caller is a user or team the environment's settings declare (``training.remote_callers``). Each has its own
launcher policy, job role, security group and config.yaml: its objects live under ``<bucket>/jobs/<caller>/`` of the
RemoteJobs bucket, its training jobs are named ``<caller>-...`` (so their log streams, ``<job name>/algo-<n>-...``,
start with it too) and tagged ``remote-job-owner=<caller>`` when they are created. IAM ties each grant to the caller
by those names, never by a value the caller chooses at run time (a role session name would be one): a caller can
neither read nor write another caller's objects, nor describe, stop, tag or read the logs of their jobs, and a job,
running as its caller's role, reaches only what its caller may reach.
"""

from __future__ import annotations

REMOTE_JOBS_PREFIX = "jobs"
OWNER_TAG_KEY = "remote-job-owner"


def caller_prefix(caller: str) -> str:
    """The caller's key prefix in the RemoteJobs bucket (no trailing slash). Caller names are checked by the settings
    (training.remote_callers): lowercase letters and digits."""
    return f"{REMOTE_JOBS_PREFIX}/{caller}"


def job_name_prefix(caller: str) -> str:
    """How every training-job name of the caller starts (the SDK appends a timestamp to ``job_name_prefix``). No
    caller name holds a hyphen, so one caller's "<caller>-" never begins another caller's job names."""
    return f"{caller}-"
