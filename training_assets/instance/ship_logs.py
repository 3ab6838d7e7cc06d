"""Send a log file to CloudWatch Logs with the AWS CLI (the instance's bootstrap log, before it powers off).

Standard library only: it runs on the host of the Deep Learning AMI, whose Python may lack boto3, and uses the
AWS CLI that the AMI ships. The training container's own output goes to CloudWatch directly (docker awslogs).

    python3 ship_logs.py --log-group /platform/dev/training --log-stream r-0123/i-0abc/bootstrap /var/log/x.log
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# PutLogEvents limits: 10,000 events and 1,048,576 bytes per call, each event counted as its UTF-8 size + 26 bytes.
MAX_EVENTS = 10_000
MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD = 26
MAX_EVENT_BYTES = 256 * 1024 - EVENT_OVERHEAD


def batches(lines: list[str], timestamp_ms: int) -> Iterator[list[dict]]:
    """Group ``lines`` into PutLogEvents batches within the API limits; over-long lines are cut."""
    batch: list[dict] = []
    size = 0
    for line in lines:
        message = line.encode()[:MAX_EVENT_BYTES].decode(errors="ignore") or " "
        event_size = len(message.encode()) + EVENT_OVERHEAD
        if batch and (len(batch) == MAX_EVENTS or size + event_size > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append({"timestamp": timestamp_ms, "message": message})
        size += event_size
    if batch:
        yield batch


def ship(path: Path, log_group: str, log_stream: str, region: str | None) -> int:
    region_args = ["--region", region] if region else []
    lines = path.read_text(errors="replace").splitlines()
    subprocess.run(
        [
            "aws",
            "logs",
            "create-log-stream",
            "--log-group-name",
            log_group,
            "--log-stream-name",
            log_stream,
            *region_args,
        ],
        check=False,  # it may exist already (a second call for the same run)
        capture_output=True,
    )
    sent = 0
    with tempfile.TemporaryDirectory() as folder:
        for number, batch in enumerate(batches(lines, int(time.time() * 1000))):
            events = Path(folder) / f"batch-{number}.json"
            events.write_text(json.dumps(batch))
            subprocess.run(
                [
                    "aws",
                    "logs",
                    "put-log-events",
                    "--log-group-name",
                    log_group,
                    "--log-stream-name",
                    log_stream,
                    "--log-events",
                    f"file://{events}",
                    *region_args,
                ],
                check=True,
                capture_output=True,
            )
            sent += len(batch)
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-group", required=True)
    parser.add_argument("--log-stream", required=True)
    parser.add_argument("--region")
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    print(f"shipped {ship(args.path, args.log_group, args.log_stream, args.region)} lines to {args.log_group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
