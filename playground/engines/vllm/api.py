"""Calls to a vLLM server's HTTP API, with every failure a one-line PlaygroundError."""

from __future__ import annotations

import json

import httpx

from playground.errors import PlaygroundError

API_KEY_ENV = "PLAYGROUND_VLLM_API_KEY"

# vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, vllm/envs.py:1143), and
# httpx keeps one for 5 s: a request sent on a connection the server is closing at that moment fails with
# "Server disconnected". Idle connections are dropped well before vLLM's keep-alive ends.
KEEPALIVE_EXPIRY_S = 2.0


class ServerAnswered(PlaygroundError):
    """The server answered, with an HTTP status other than 200."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


def http_client(api_key: str | None, timeout: httpx.Timeout) -> httpx.Client:
    """A client for vLLM servers that sends `api_key` (vLLM's --api-key) as a bearer token, if given."""
    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=100, max_keepalive_connections=20,
                                                                keepalive_expiry=KEEPALIVE_EXPIRY_S),
                        headers={"Authorization": f"Bearer {api_key}"} if api_key else None)


def refusal(url: str, path: str, response: httpx.Response) -> ServerAnswered:
    """The error for a non-200 answer: a refused API key named as such."""
    if response.status_code == 401:
        refused = "the API key given" if "Authorization" in response.request.headers else "a request without an API key"
        return ServerAnswered(f"the vLLM server at {url} refused {refused} (401 on {path}): pass the key it was "
                              f"started with (--api-key) as --vllm-api-key KEY or {API_KEY_ENV}", 401)
    return ServerAnswered(f"the server at {url} answered {path} with {response.status_code}: "
                          f"{error_text(response.read())}", response.status_code)


def call(client: httpx.Client, method: str, url: str, path: str, **kwargs) -> httpx.Response:
    """`method` `url + path`; a 200 answer, or a PlaygroundError that says what went wrong."""
    try:
        response = client.request(method, f"{url}{path}", **kwargs)
    except httpx.ConnectError:
        raise PlaygroundError(f"cannot reach the vLLM server at {url}: is it running?") from None
    except httpx.HTTPError as e:
        raise PlaygroundError(f"the vLLM server at {url} did not answer {path}: {type(e).__name__}") from None
    except httpx.InvalidURL as e:
        raise PlaygroundError(f"{url} is not a URL: {e}") from None
    if response.status_code != 200:
        raise refusal(url, path, response)
    return response


def call_json(client: httpx.Client, method: str, url: str, path: str, **kwargs) -> dict:
    response = call(client, method, url, path, **kwargs)
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise PlaygroundError(f"the server at {url} does not answer {path} as vLLM does")
    return data


def error_text(payload) -> str:
    """The message of a vLLM error body (or the start of whatever else it is)."""
    try:
        data = json.loads(payload) if isinstance(payload, (bytes, str)) else payload
        error = data.get("error", data)
        return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except (ValueError, AttributeError):
        return (payload.decode(errors="replace") if isinstance(payload, bytes) else str(payload))[:300]
