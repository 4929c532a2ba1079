"""Credentials kept out of every output and the record: a URL's userinfo and token-like query values.

`https://user:TOKEN@host/x?token=T&sig=S` reads `https://***@host/x?token=***&sig=***`, also where a
path's normalisation left `https:/user:TOKEN@host`. The userinfo ends at the last `@` before the host (a
password may hold `@`, `:` and every RFC 3986 sub-delim, `'` included, raw or percent-encoded); it cannot hold
`/`, `?`, `#` or whitespace, which end the authority. A query key that ends in `key` (`api_key`, `apiKey`,
`x-api-key`, `accessKey`) is a secret's, as are those naming a token, secret, password, signature or
credential. The query rule also matches after `;` (so `&amp;token=` in rendered HTML and XML is redacted too)
and in a fragment (`#access_token=`, as OAuth redirects carry it).
"""
from __future__ import annotations

import re

REDACTED = "***"
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2})[^/\s?#\"<>]+@")  # greedy: to the last @
_SECRET_KEYS = (r"[\w.-]*(?:token|secret|passw(?:or)?d|signature|credential)[\w.-]*|sig|pwd|auth|"
                r"[\w.-]*key")
_QUERY = re.compile(rf"([?&;#](?:{_SECRET_KEYS})=)[^&;\s#'\"<>\\]+", re.IGNORECASE)


def redact(text: str) -> str:
    """text with every URL's userinfo and every token-like query value replaced by ***."""
    return _QUERY.sub(rf"\1{REDACTED}", _USERINFO.sub(rf"\1{REDACTED}@", text))


def redact_all(items: "list[str] | tuple[str, ...]") -> list[str]:
    """Each of items redacted (an argument list, such as the command line a run stores)."""
    return [redact(item) for item in items]


def redact_json(value):
    """A JSON-like value (dicts, lists, strings) with every string in it, dict keys included, redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(key) if isinstance(key, str) else key: redact_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(item) for item in value]
    return value
