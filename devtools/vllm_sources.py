"""The source archives of the vLLM releases the probe claims to fit but this machine does not run
(0.30.0 and 0.33.0: 0.31.0 and 0.32.0 are installed for the tests), fetched once from PyPI with their
sha256 checked, never installed: tests/test_probe_fits_releases.py reads the hooked code in them.
Usage: python -m devtools.vllm_sources   (scripts/test.sh runs it)"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

RELEASES = ("0.30.0", "0.33.0")
FOLDER = Path(__file__).resolve().parents[1] / ".vllm-sources"
INDEX = "https://pypi.org/simple/vllm/"


def archive(version: str) -> Path:
    return FOLDER / f"vllm-{version}.tar.gz"


def fetch(version: str) -> Path:
    """The release's sdist, downloaded where it is not here yet."""
    path = archive(version)
    if path.exists():
        return path
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = {f["filename"]: f for f in json.load(answer)["files"]}
    listed = files[path.name]
    with urllib.request.urlopen(listed["url"], timeout=600) as answer:
        data = answer.read()
    if hashlib.sha256(data).hexdigest() != listed["hashes"]["sha256"]:
        raise RuntimeError(f"{path.name}: the download's sha256 is not PyPI's")
    FOLDER.mkdir(exist_ok=True)
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.rename(path)
    return path


def main() -> int:
    for version in RELEASES:
        print(f"vllm {version} source: {fetch(version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
