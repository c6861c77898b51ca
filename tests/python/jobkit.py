"""Helpers for the import/export suites: container URIs (file:// and Azurite SAS), devices.txt
files, and waiting for a job to finish."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

from azurite import ACCOUNT_KEY, ACCOUNT_NAME

FINISHED = ("completed", "failed", "cancelled")


def file_uri(path: Path) -> str:
    return Path(path).absolute().as_uri()


def azurite_container(blob, name: str) -> tuple[str, object]:
    """Creates container `name` in Azurite; returns its SAS URI (path style) and a client."""
    service = BlobServiceClient.from_connection_string(blob.connection_string)
    container = service.create_container(name)
    sas = generate_container_sas(
        ACCOUNT_NAME, name, account_key=ACCOUNT_KEY,
        permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True, add=True, create=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=2))
    return f"http://{blob.host}:{blob.port}/{ACCOUNT_NAME}/{name}?{sas}", container


def write_lines(path: Path, lines) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def wait_job(get, job_id: str, timeout: float = 120, seen: list | None = None) -> dict:
    """Polls `get(job_id)` (a dict or an SDK JobProperties) until the job is finished."""
    deadline = time.time() + timeout
    while True:
        job = get(job_id)
        status = job["status"] if isinstance(job, dict) else job.status
        if seen is not None and (not seen or seen[-1] != status):
            seen.append(status)
        if status in FINISHED:
            return job
        assert time.time() < deadline, f"job {job_id} still {status}"
        time.sleep(0.05)


def read_lines(text: str) -> list[dict]:
    return [json.loads(l) for l in text.splitlines() if l.strip()]


def import_devices(hub, base: Path, lines) -> dict:
    """Imports `lines` (devices.txt objects) through an import job from file:// containers
    under `base`; returns the finished job, which must have completed."""
    write_lines(base / "in" / "devices.txt", lines)
    token = hub.token()
    r = hub.request("POST", "/jobs/create", token, json={
        "type": "import", "inputBlobContainerUri": file_uri(base / "in"),
        "outputBlobContainerUri": file_uri(base / "out")})
    assert r.status_code == 200, r.text
    job = wait_job(lambda j: hub.request("GET", f"/jobs/{j}", token).json(), r.json()["jobId"], timeout=300)
    assert job["status"] == "completed", job
    return job
