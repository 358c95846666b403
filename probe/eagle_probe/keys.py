"""A probe key: the proof that a request's sender holds the server's API key.

A request is recorded only under a key of one fixed form: 64 lowercase hex characters, a 32-character
nonce of the client's choosing and the first 32 of HMAC-SHA256(secret, nonce), where the secret is
HMAC-SHA256(api_key, "eagle_probe key"). vLLM's API key guards some routes and not others (`POST
/invocations`, vllm/entrypoints/serve/sagemaker/api_router.py ~99, takes a full completion without it),
so the probe does not ask which route a request came through: it asks the request to prove the key.
A server without an API key lets anyone read its /v1 routes, so there the secret is the empty key's,
which anyone can compute. The workers never see the API key: the API process hands them the secrets
(and a token for its calls, which vLLM's development endpoint `/collective_rpc` cannot know) at start.
"""

from __future__ import annotations

import hashlib
import hmac
import re

KEY_FORM = re.compile(r"[0-9a-f]{64}")
NONCE_CHARS = 32


def secret_of(api_key: str | None) -> bytes:
    """What a client and the workers derive from the API key (None or "": a server without one)."""
    return hmac.new((api_key or "").encode(), b"eagle_probe key", hashlib.sha256).digest()


def rpc_token(api_keys: list[str]) -> str:
    """What the API process sends with every call to the workers: derived from all the server's API keys,
    so every API process of one server sends the same, and nobody without them can."""
    return hmac.new("\n".join(sorted(api_keys)).encode(), b"eagle_probe rpc", hashlib.sha256).hexdigest()


def key_for(secret: bytes, nonce: str) -> str:
    """The key of `nonce` (32 lowercase hex characters) under `secret`."""
    return nonce + hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()[:64 - NONCE_CHARS]


def proven(key: object, secrets: list[bytes]) -> bool:
    """Whether `key` has the probe key's form and was made under one of `secrets`."""
    if not isinstance(key, str) or not KEY_FORM.fullmatch(key):
        return False
    return any(hmac.compare_digest(key_for(secret, key[:NONCE_CHARS]), key) for secret in secrets)


def digest(key: str) -> str:
    """How the probe names a key it lists or remembers: never the key itself."""
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
