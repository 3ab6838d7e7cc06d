"""Every AWS call a process makes, recorded and checked against the synthesized policy of the principal making it.

A principal is known by its access key: each one (the training launcher, the training instance's role, the endpoint's
execution role, ...) gets its own key pair, and whoever acts as it holds that pair in its environment, so calls made
by the AWS CLI in a shell script, by a tool's boto3 client or by an SDK's worker threads are all attributed the way
AWS attributes them. ``install`` wraps botocore's ``BaseClient._make_api_call`` (the AWS CLI v1 and boto3 both call
through it): the call is mapped to the IAM requests it needs (``iam_requests.requests_for``) and evaluated
against the principal's identity policies together with the resource's own policy where the templates give it one (a
bucket's policy, a topic's, a KMS key's policy: ``Gate.bucket_policies``, ``Gate.topic_policies``,
``Gate.key_policies``) and, for a principal inside the VPC, the policy of the VPC endpoint its call passes
(``Gate.endpoint_policies``), as IAM decides a request in the resource's account; a refused call gets the
AccessDenied error IAM would send and never reaches the emulator.
Each call is one JSON line in the gate's log, with the rehearsal step that was running.

A subprocess joins the gate through the environment: ``REHEARSAL_GATE`` names the gate file and
``python -m proving_ground.rehearsal.aws_calls aws ARGS`` runs the AWS CLI with the gate installed (the ``aws`` shim
of the rehearsal's
hosts). ``python -m proving_ground.rehearsal.aws_calls serve SOCKET`` does the same for many calls: it imports the CLI
once and forks a
child per call, which takes the caller's arguments, environment, working folder and standard streams and runs the
CLI as that process would (proving_ground/rehearsal/ec2_host.py's ``AWS_CLIENT`` is the caller's side). A rehearsal
makes dozens of
CLI calls from its nodes' shell scripts, and a new Python importing the CLI spent 0.4 CPU-s on each. A server
outlives no caller: it stops by itself when the process that started it is gone.

Principals without policies (``policies=None``) are recorded but not checked: AWS services acting on their own (EC2
terminating an instance that powered off) and the administrator who deploys and operates the platform, for whom
the templates define no policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from ops_review.iam_policy import Request, Unsupported, is_allowed
from proving_ground.iam_requests import Call, requests_for

GATE_ENV = "REHEARSAL_GATE"
STEP_ENV = "REHEARSAL_STEP"


@dataclass
class Principal:
    name: str
    access_key: str
    # Identity policies (resolved JSON documents); None: recorded, not checked (see the module docstring).
    policies: list[dict[str, Any]] | None
    # Global condition keys IAM sets for this principal (aws:userid, aws:PrincipalArn, ...).
    identity: dict[str, str] = field(default_factory=dict)
    secret_key: str = "rehearsal-secret"
    # Calls from inside the VPC (an instance, a job, an endpoint): they pass the VPC endpoint of their service.
    in_vpc: bool = False

    def environment(self) -> dict[str, str]:
        """The variables that make a process act as this principal."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


@dataclass
class Record:
    step: str
    principal: str
    service: str
    operation: str
    target: str
    requests: list[tuple[str, str]]
    # True / False: evaluated; None: not checked (principal without policies, or no credentials at all).
    allowed: bool | None
    error: str | None = None
    at: float = 0.0  # time.time() of the call


@dataclass
class Gate:
    account: str
    region: str
    log: Path
    principals: list[Principal]
    # Bucket -> key ARN of its default SSE-KMS encryption (S3 calls KMS as the caller).
    kms_encrypted_buckets: dict[str, str] = field(default_factory=dict)
    # Launch template id -> what RunInstances from it creates (``proving_ground.iam_requests.run_instances_requests``).
    launch_templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Bucket name -> its bucket policy, key ARN -> its key policy (resolved): evaluated with every request on them.
    bucket_policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    key_policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Topic ARN -> its topic policy; botocore service name -> the VPC endpoint its calls from the VPC pass:
    # {"id": vpce id, "vpc": vpc id, "policy": the endpoint policy}.
    topic_policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    endpoint_policies: dict[str, dict[str, Any]] = field(default_factory=dict)

    def principal(self, name: str) -> Principal:
        (found,) = [p for p in self.principals if p.name == name]
        return found

    def save(self, path: Path) -> Path:
        data = {**asdict(self), "log": str(self.log)}
        path.write_text(json.dumps(data, default=str))
        return path

    @classmethod
    def load(cls, path: Path) -> Gate:
        data = json.loads(Path(path).read_text())
        data["log"] = Path(data["log"])
        data["principals"] = [Principal(**p) for p in data["principals"]]
        return cls(**data)

    def records(self) -> list[Record]:
        if not self.log.exists():
            return []
        return [
            Record(**{**row, "requests": [tuple(r) for r in row["requests"]]})
            for row in map(json.loads, self.log.read_text().splitlines())
        ]


_lock = threading.Lock()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return f"<{type(value).__name__}>"  # streams (upload bodies)


def _target(params: dict[str, Any]) -> str:
    """A short name of what the call touches, for the report."""
    if "Bucket" in params:
        return f"s3://{params['Bucket']}/{params.get('Key', params.get('Prefix', ''))}"
    for name in ("EndpointName", "TrainingJobName", "logGroupName", "Name", "StackName", "ResourceId", "QuotaCode"):
        if name in params:
            return f"{name}={params[name]}"
    if "LaunchTemplate" in params:
        return f"LaunchTemplate={params['LaunchTemplate']}"
    return ""


def _write(gate: Gate, record: Record) -> None:
    line = json.dumps(asdict(record)) + "\n"
    with _lock, gate.log.open("a") as log:
        log.write(line)


def denied(operation: str, principal: Principal, request: Request) -> Exception:
    from botocore.exceptions import ClientError

    arn = principal.identity.get("aws:PrincipalArn", principal.name)
    message = f"User: {arn} is not authorized to perform: {request.action} on resource: {request.resource}"
    error = {"Error": {"Code": "AccessDenied", "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 403}}
    return ClientError(error, operation)


StandIn = Callable[[dict[str, Any]], dict[str, Any]]

# What IAM knows of every request the gate's principals make: they are no AWS service, and the AWS CLI and SDKs call
# over HTTPS (the emulator's http:// endpoint is the rehearsal's, not what AWS would see).
_REQUEST_CONTEXT = {"aws:SecureTransport": "true", "aws:PrincipalIsAWSService": "false"}


def allowed_with_resource_policies(
    gate: Gate, policies: list[dict[str, Any]], request: Request, *, endpoint: str | None = None
) -> bool:
    """The decision for ``request`` by the identity ``policies``, the bucket's policy (an S3 request on a bucket of
    ``gate.bucket_policies``), the topic's policy (``gate.topic_policies``), the key's policy (a KMS request on a key
    of ``gate.key_policies``, which KMS requires to allow: by itself or by delegating to the account's IAM policies),
    and the policy of the VPC endpoint the call passes (``endpoint``: the botocore service name of a call made from
    inside the VPC; ``gate.endpoint_policies``), which must allow it as well (VPC user guide, "Control access to VPC
    endpoints using endpoint policies")."""
    # The resource's account: the ARN's, else (S3 ARNs name none) the rehearsal's, which owns every bucket it makes.
    arn_account = request.resource.split(":")[4] if request.resource.count(":") >= 5 else ""
    context = {**_REQUEST_CONTEXT, "aws:ResourceAccount": arn_account or gate.account, **request.context}
    service = request.action.partition(":")[0].lower()
    # Only the call's own service passes the endpoint: what that service asks of another on the caller's behalf
    # (S3 asking KMS for a data key) goes from service to service.
    own = {"sagemaker-runtime": "sagemaker"}.get(endpoint or "", endpoint)
    passes = gate.endpoint_policies.get(endpoint or "") if own == service else None
    if passes is not None:
        context.update({"aws:SourceVpce": passes["id"], "aws:SourceVpc": passes["vpc"]})
    contextual = Request(request.action, request.resource, context)
    boundaries = [passes["policy"]] if passes is not None else []
    if service == "s3":
        bucket = request.resource.removeprefix("arn:aws:s3:::").split("/", 1)[0]
        bucket_policy = gate.bucket_policies.get(bucket)
        return is_allowed(policies, contextual, resource_policies=[bucket_policy] if bucket_policy else [],
                          endpoint_policies=boundaries)  # fmt: skip
    if service == "sns" and request.resource in gate.topic_policies:
        return is_allowed(policies, contextual, resource_policies=[gate.topic_policies[request.resource]],
                          endpoint_policies=boundaries)  # fmt: skip
    if service == "kms" and request.resource in gate.key_policies:
        return is_allowed(policies, contextual, key_policy=gate.key_policies[request.resource],
                          endpoint_policies=boundaries)  # fmt: skip
    return is_allowed(policies, contextual, endpoint_policies=boundaries)


# Long: botocore's before-call hook that records, stands in for and gates every call, with its undo: the pieces share
# the hook's state
def install(
    gate: Gate,
    *,
    stand_ins: dict[tuple[str, str], StandIn] | None = None,
    resource_tags: Callable[[str], dict[str, str]] | None = None,
) -> Callable[[], None]:
    """Check every botocore call of this process; return the function that removes the check.

    ``stand_ins``: (service, operation) -> answer, for an API the emulator lacks (the call is still checked);
    ``resource_tags``: the tags of an existing resource by ARN (for aws:ResourceTag conditions).
    """
    import botocore.client

    original = botocore.client.BaseClient._make_api_call
    answers = stand_ins or {}

    def checked(client: Any, operation: str, params: dict[str, Any]) -> Any:
        service = client.meta.service_model.service_name
        step = os.environ.get(STEP_ENV, "")
        credentials = client._request_signer._credentials
        key = credentials.get_frozen_credentials().access_key if credentials is not None else None
        principal = next((p for p in gate.principals if p.access_key == key), None)  # principals may join later
        target = _target(params)

        def record(name: str, requests: list[Request], allowed: bool | None, error: str | None = None) -> None:
            pairs = [(r.action, r.resource) for r in requests]
            _write(gate, Record(step, name, service, operation, target, pairs, allowed, error, time.time()))

        if key is None:
            record("(no credentials)", [], None, "no credentials")
            return original(client, operation, params)  # botocore raises NoCredentialsError, as on AWS
        if principal is None:
            from botocore.exceptions import ClientError

            record(f"(unknown key {key})", [], False, "unknown access key")
            error = {"Error": {"Code": "InvalidClientTokenId", "Message": "The security token is not valid."}}
            raise ClientError(error, operation)
        if principal.policies is not None:
            call = Call(service, operation, _jsonable(dict(params)), gate.region, gate.account)
            try:
                requests = requests_for(
                    call,
                    kms_encrypted_buckets=gate.kms_encrypted_buckets,
                    principal={**principal.identity, "aws:PrincipalAccount": gate.account},
                    resource_tags=resource_tags,
                    launch_templates=gate.launch_templates,
                )
            except Unsupported as gap:
                record(principal.name, [], False, f"unmapped: {gap}")
                raise
            endpoint = service if principal.in_vpc else None
            policies = principal.policies
            refused = [r for r in requests if not allowed_with_resource_policies(gate, policies, r, endpoint=endpoint)]
            record(principal.name, requests, not refused, None if not refused else "AccessDenied")
            if refused:
                raise denied(operation, principal, refused[0])
        else:
            record(principal.name, [], None)
        if (service, operation) in answers:
            return answers[(service, operation)](dict(params))
        if (service, operation) == ("sts", "GetCallerIdentity"):
            return {
                "UserId": principal.identity.get("aws:userid", principal.name),
                "Account": gate.account,
                "Arn": principal.identity.get("aws:PrincipalArn", principal.name),
            }
        return original(client, operation, params)

    botocore.client.BaseClient._make_api_call = checked

    def uninstall() -> None:
        botocore.client.BaseClient._make_api_call = original

    return uninstall


def refusals(records: list[Record], step: str | None = None) -> Iterator[Record]:
    """Calls a checked principal was refused (or that had no IAM mapping), in the order they were made."""
    return (r for r in records if r.allowed is False and step in (None, r.step))


def _run_aws_cli(argv: list[str]) -> int:
    """The AWS CLI v1 with the gate of ``REHEARSAL_GATE`` installed (its own botocore comes first on PYTHONPATH)."""
    install(Gate.load(Path(os.environ[GATE_ENV])))
    from awscli.clidriver import main as aws_main  # type: ignore[import-not-found]

    sys.argv = ["aws", *argv]
    return int(aws_main())


def parse_json_data_once() -> Callable[[], None]:
    """botocore's data files (endpoints, service models: megabytes of JSON in ~400 service folders) found and parsed
    once per process instead of once per session: each session has its own loader, which walks every service folder
    again (~3,000 file checks: half of a new session's first client) and parses the files again, and the tools and SDKs
    a rehearsal or a test run in one process make hundreds of sessions. botocore already shares what a loader found and
    parsed between the clients of a session; the one change it makes to a model, merging its sdk-extras, gives the same
    model when made again; the folders do not change while the process runs. Returns the undo."""
    import botocore.loaders

    loader_class = botocore.loaders.Loader
    load_file = botocore.loaders.JSONFileLoader.load_file
    parsed: dict[str, Any] = {}

    def parsed_once(loader: Any, file_path: str) -> Any:
        if file_path not in parsed:
            parsed[file_path] = load_file(loader, file_path)
        return parsed[file_path]

    # The folder walks, by the loader's search paths: answers are lists of names, copied for each caller.
    listings = {name: getattr(loader_class, name) for name in ("list_available_services", "list_api_versions")}
    found: dict[tuple[Any, ...], list[str]] = {}

    def listed_once(name: str) -> Callable[..., list[str]]:
        def listed(loader: Any, *args: str, **kwargs: str) -> list[str]:
            key = (name, tuple(loader.search_paths), args, tuple(sorted(kwargs.items())))
            if key not in found:
                found[key] = listings[name](loader, *args, **kwargs)
            return list(found[key])

        return listed

    botocore.loaders.JSONFileLoader.load_file = parsed_once
    for name in listings:
        setattr(loader_class, name, listed_once(name))

    def undo() -> None:
        botocore.loaders.JSONFileLoader.load_file = load_file
        for name, method in listings.items():
            setattr(loader_class, name, method)

    return undo


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One call: a JSON line {argv, env, cwd} and the caller's stdin, stdout and stderr (SCM_RIGHTS)."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 20)
        if not more:
            raise EOFError("the caller hung up")
        data += more
    return json.loads(data), fds


def _child(connection: socket.socket, call: dict[str, Any], fds: list[int], imported: dict[str, str]) -> None:
    """In the forked child: become the caller's ``aws`` process, run the CLI, send its exit code back."""
    code = 255
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(call["cwd"])
        os.environ.clear()
        os.environ.update({**call["env"], **imported})
        try:
            code = _run_aws_cli(call["argv"])
        except SystemExit as exit_:  # argparse's usage errors, as the CLI's own process ends with them
            code = exit_.code if isinstance(exit_.code, int) else 255
        except BaseException:  # what an uncaught exception would print, then the CLI's 255
            import traceback

            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the caller may have closed its end
                stream.flush()
        try:
            connection.sendall(f"{code}\n".encode())
        finally:
            os._exit(code)


def start_server(
    path: Path, aws_cli: Path, environment: dict[str, str], log: Path, services: Iterable[str] = ()
) -> Callable[[], None]:
    """``serve`` in a process of its own, answering on ``path`` (a short path: Unix sockets allow 107 bytes) with the
    CLI of ``aws_cli`` (proving_ground/rehearsal/ec2_host.py's ``unpack_aws_cli``), the models of ``services`` loaded
    ahead; returns the
    function that stops it. The callers bring their own environment: ``environment`` only runs the server."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "proving_ground.rehearsal.aws_calls", "serve", str(path), *services],
            env={**environment, "PYTHONPATH": f"{root}:{aws_cli}"},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )

    def stop() -> None:
        process.terminate()  # the server waits for the calls still running
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a call that hangs: it is left to end on its own
            process.kill()
            process.wait()
        path.unlink(missing_ok=True)

    deadline = time.monotonic() + 60
    while not path.exists():  # bound before the CLI is imported: a call made earlier waits in the queue
        if process.poll() is not None or time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"the aws call server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.01)
    return stop


def serve(path: Path, services: Iterable[str] = ()) -> None:
    """Answer ``aws`` calls on the Unix socket ``path`` until SIGTERM (see the module docstring); the models of
    ``services`` are loaded before the first call."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    before = dict(os.environ)
    import botocore.client  # noqa: F401 - what install() imports, once
    from awscli.clidriver import create_clidriver

    # The CLI's JSON data (its commands, endpoints, the services' models: megabytes, half of a call's CPU) parsed once
    # here: a child reads the parsed copy it inherits, and whatever it changes stays in the child.
    parse_json_data_once()
    driver = create_clidriver()  # imports the CLI's plugins; each call still builds its own driver and session
    driver._get_command_table()
    driver.session.get_component("endpoint_resolver")
    for service in services:
        driver.session.get_service_model(service)

    # What the import wrote into the environment (awscli sets AWS_DATA_PATH to its data): each call's too.
    imported = {name: value for name, value in os.environ.items() if before.get(name) != value}

    def stop(*_: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=_stop_when_orphaned, args=(parent,), daemon=True).start()
    try:
        while True:
            connection, _ = listener.accept()
            try:
                call, fds = _receive(connection)
            except (OSError, ValueError, EOFError):
                connection.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                listener.close()
                _child(connection, call, fds, imported)
            for fd in fds:  # the caller's streams stay open only in the child: a reader of its output sees the end
                os.close(fd)
            connection.close()
            _reap(block=False)
    finally:
        # Waited for, not left to the kernel: so their CPU time counts in this process's children, as a process
        # per call counted in its caller's.
        _reap(block=True)


def _stop_when_orphaned(parent: int) -> None:
    """A server whose caller is gone without stopping it (killed, or ended without running its exit handlers)
    stops itself: SIGTERM, as the caller would have sent it, within a second."""
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)


def _reap(*, block: bool) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(Path(sys.argv[2]), sys.argv[3:])
    if len(sys.argv) < 2 or sys.argv[1] != "aws":
        sys.exit(
            "usage: python -m proving_ground.rehearsal.aws_calls aws ARGS | serve SOCKET [SERVICE...]"
            " (REHEARSAL_GATE: gate file)"
        )
    sys.exit(_run_aws_cli(sys.argv[2:]))
