"""`NAME=URL`: how the command line, the page's backend and its Your servers tab name a vLLM server,
read by one parser."""

from __future__ import annotations

from typing import Callable

import httpx

from playground.errors import PlaygroundError


def server_urls(specs: list[str] | tuple[str, ...], flag: str,
                unnamed: Callable[[httpx.URL], str] | None = None) -> dict[str, str]:
    """URLs by name, from `NAME=URL` entries (the URL http:// or https:// with a host, kept without its
    trailing slash). A bare URL is named `unnamed(url)`; without `unnamed`, it is an error, as is a name
    given twice. `flag` names where the entries came from, in the messages."""
    servers: dict[str, str] = {}
    for spec in specs:
        head, sep, rest = spec.partition("://")
        name, _, scheme = head.rpartition("=")
        url, name = (scheme + sep + rest).strip().rstrip("/"), name.strip()
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            parsed = None
        if not url.startswith(("http://", "https://")) or parsed is None or not parsed.host:
            raise PlaygroundError(f"bad {flag} {spec!r}: use NAME=URL, the URL starting with http:// or https://")
        if not name and unnamed is None:
            raise PlaygroundError(f"bad {flag} {spec!r}: use NAME=URL, with a name")
        name = name or unnamed(parsed)
        if name in servers:
            raise PlaygroundError(f"{flag} names {name} twice")
        servers[name] = url
    return servers
