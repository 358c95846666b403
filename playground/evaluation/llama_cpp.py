"""llama.cpp as a peer in `bench kernels`, where scripts/build-llama-cpp.sh has built it.

llama-server runs the same float32 weights (the embedded target converted by llama.cpp's own
converter), or the GGUF file the target comes from (Q4_1 layers, a Q8_0 head), with no speculation
and with the shipped EAGLE 3 drafter (`--spec-type draft-eagle3`, k drafts a step); each completion
gets the prompt as our token ids, greedy, and reports its decode rate, tokens drafted and accepted.
llama.cpp's EAGLE-3 has no EAGLE 3.1 switches: EAGLE 3 only. On the Q4_1 file its tokens may differ
from ours: it rounds the activations to 8 bits for its integer dot products, we keep them in float32.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from playground.errors import PlaygroundError
from playground.model.target import EMBEDDED_GGUF, embedded_gguf_dir
from playground.settings import cache_root

START_TIMEOUT_S = 120


def root() -> Path:
    return cache_root() / "llama.cpp"


def model_file(weights: str) -> Path:
    """The target as llama.cpp reads it: converted to float32 ("f32"), or the shipped file ("gguf")."""
    return root() / "models/target-f32.gguf" if weights == "f32" else embedded_gguf_dir() / EMBEDDED_GGUF


def available() -> bool:
    return all((root() / part).is_file() for part in ("bin/llama-server", "models/target-f32.gguf", "models/eagle3.gguf"))


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    decode_tokens_per_s: float
    mean_acceptance_length: float  # tokens per verify step: emitted / (emitted - accepted drafts)


class LlamaServer:
    """One llama-server on a free local port, two threads, one slot; stopped by close()."""

    def __init__(self, k: int | None, weights: str = "f32"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [str(root() / "bin/llama-server"), "-m", str(model_file(weights)), "-t", "2",
                   "-c", "8192", "-np", "1", "--host", "127.0.0.1", "--port", str(self.port), "--no-webui"]
        if k is not None:
            command += ["-md", str(root() / "models/eagle3.gguf"), "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(k),
                        "-td", "2"]
        self.log = (root() / f"server-{weights}-{'eagle3' if k else 'none'}.log").open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            status = self.process.poll()
            if status is not None or time.monotonic() > deadline:
                self.close()
                why = f"exit status {status}" if status is not None else f"no answer in {START_TIMEOUT_S} s"
                raise PlaygroundError(f"llama-server did not start ({why}): see {self.log.name}")
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def complete(self, prompt_ids: list[int], max_tokens: int) -> Completion:
        body = {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True}
        answer = httpx.post(f"{self.url}/completion", json=body, timeout=600).raise_for_status().json()
        timings = answer["timings"]
        emitted, accepted = timings["predicted_n"], timings.get("draft_n_accepted", 0)
        return Completion(tuple(answer["tokens"]), timings["predicted_per_second"], emitted / max(1, emitted - accepted))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
