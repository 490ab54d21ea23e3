"""Credentials out of every text we show or write: one function, used by errors, logs and the CLI.

`redact(text)` works on a URL or on any text that may hold URLs (an error message, a `pipe:`
command, a log line):

- userinfo of every `scheme://` URL, whatever characters the password holds (`@` included:
  the userinfo runs to the *last* `@` of the authority), also a careless `user:pa/ss@host`;
- the value of every `name=value` whose name looks secret: `token`, `*_token`, `key`, `*_key`,
  `secret`, `*signature` (AWS and GCS signed URLs), `*credential`, `sig`, `password`, ...
- in commands: `-u user:pass` (also `-sfu user:pass`) / `--user` / `--oauth2-bearer`, `Authorization:`
  header values, and `-H` headers whose names look secret (`PRIVATE-TOKEN`, `X-Api-Key`);
- in a mapping's repr (an HTTP library's request headers): the values of keys that look secret
  (`'Authorization'`, `'X-Amz-Security-Token'`, `'Cookie'`, `'X-Api-Key'`, ...; not a bare
  `'key'`, which JSON samples use for other things).

Redaction errs on the side of hiding: `?monkey=1` loses its value too.
"""

from __future__ import annotations

import re
from typing import Sequence, Tuple

__all__ = ["redact", "redact_url", "url_secrets", "without_userinfo"]

MASK = "***"

# To the next space (a password may hold quotes), less a comma that ends a clause ("url=..., offset=0")
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^\s,]|,(?!\s|$))+")
_PORT = re.compile(r":\d*$")
_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")
_SECRET_NAME = r"[\w.-]*(?:key|token|secret|signature|password|passwd|credential|auth)[\w.-]*|sig|pwd|pass"
_ASSIGNMENT = re.compile(rf"(?i)((?:^|[?&#;:\s'\"(,])(?:{_SECRET_NAME})=)(?:[^&#;\s'\",]|,(?!\s|$))*")
# -u also as the last of a cluster of short flags (curl -sfu user:pass), and a bearer option
_USER_OPTION = re.compile(r"((?:^|\s)(?:-[a-zA-Z]{0,6}u\s*|--user[=\s]+|--password[=\s]+|--oauth2-bearer[=\s]+))"
                          r"(['\"]?)[^\s'\"]+")
_AUTH_HEADER = re.compile(r"(?i)(authorization\s*:\s*)[^'\"\n]+")
# a header in a mapping's repr (aiohttp's errors show their request's): 'Authorization': 'Basic ...'
_HEADER_NAME = (r"(?:proxy-)?authorization|(?:set-)?cookie"
                r"|[\w-]*(?:token|secret|signature|credential|password|passwd|api[-_]?key|access[-_]?key)[\w-]*")
_HEADER_ITEM = re.compile(rf"(?i)((?:^|[\s{{,(])['\"](?:{_HEADER_NAME})['\"]\s*:\s*b?['\"])[^'\"\n]*")
# a header given on a command line: -H 'PRIVATE-TOKEN: ...', --header "X-Api-Key: ..."
_HEADER_OPTION = re.compile(rf"(?i)((?:^|\s)(?:-H|--header)[=\s]*['\"]?(?:{_HEADER_NAME})\s*:\s*)[^'\"\n]+")


_HOST = re.compile(r"[\w.\-]*(?::\d*)?$")  # what may follow a userinfo's "@" up to the path: host[:port]


def _userinfo_end(rest: str) -> int:
    """Where the userinfo of a URL (`rest`: what follows "scheme://") ends: the index of its "@",
    or -1 when it has none."""
    end = len(rest)
    for delimiter in "?#":
        found = rest.find(delimiter)
        if found != -1:
            end = min(end, found)
    before_query = rest[:end]
    slash = before_query.find("/")
    authority = before_query if slash == -1 else before_query[:slash]
    at = authority.rfind("@")
    if at != -1:
        return at
    # `user:pa/ss@host`, `user:pa#ss@host`, `user:pa?ss@host`: a "/", "#" or "?" in the password
    # ends the authority early. An authority with a colon that is not a port (nor IPv6 brackets),
    # then the first "@" whose text up to the next "/" is a host, is taken as userinfo all the same.
    # So is `user:1234/5678@host.name` (a password of digits reads as a port): there the user must
    # not look like a host (no dot) and the text after the "@" must (a dot, a port, localhost).
    if ":" not in authority or authority.startswith("["):
        return -1
    port_like = _PORT.search(authority) is not None
    if port_like and ("." in authority or authority.partition(":")[0].lower() == "localhost"):
        return -1
    at = rest.find("@")
    if at == -1:
        return -1
    slash = rest.find("/", at + 1)
    host = rest[at + 1: len(rest) if slash == -1 else slash]
    if port_like and not ("." in host or ":" in host or host.lower() == "localhost"):
        return -1
    return at if _HOST.match(host) else -1


def _userinfo(url: str) -> str:
    scheme, _, rest = url.partition("://")
    at = _userinfo_end(rest)
    return url if at == -1 else f"{scheme}://{MASK}@{rest[at + 1:]}"


def redact(text: object, secrets: Sequence[str] = ()) -> str:
    """`text` as a string with every credential it holds replaced by ***, and every one of
    `secrets` (say, the pieces of a URL's password, `url_secrets`) wherever it appears."""
    result = _URL.sub(lambda m: _userinfo(m.group(0)), str(text))
    result = _ASSIGNMENT.sub(rf"\1{MASK}", result)
    result = _USER_OPTION.sub(rf"\1\2{MASK}", result)
    result = _HEADER_ITEM.sub(rf"\1{MASK}", result)
    result = _AUTH_HEADER.sub(rf"\1{MASK}", result)
    result = _HEADER_OPTION.sub(rf"\1{MASK}", result)
    for secret in secrets:
        result = result.replace(secret, MASK)
    return result


def without_userinfo(url: str) -> str:
    """`url` without the userinfo of its authority (`user:pass@`), whatever the password holds."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return url
    rest = url[scheme.end():]
    at = _userinfo_end(rest)
    return url if at == -1 else url[:scheme.end()] + rest[at + 1:]


def redact_url(url: object) -> str:
    """`redact(url)`, the pieces of its password masked wherever they appear too: a password
    that holds a raw space (`http://bob:hunter 2@host/a.tar`, sent as typed) ends the URL a
    text search finds at the space."""
    text = str(url)
    return redact(text, url_secrets(text))


def url_secrets(url: str) -> Tuple[str, ...]:
    """The pieces of `url`'s password (split at "#", "?", "/", "@"; 3 characters or more), for
    texts that may quote them out of context: a parser's "invalid port 'Zq9'" for
    `user:Zq9#x@host`. (Not the user name: masking it would garble ordinary words.) `url` that
    is one URL is read whole: a password may hold a space."""
    scheme = _SCHEME.match(url)
    if scheme is not None:
        rest = url[scheme.end():]
    else:
        found = _URL.search(url)
        if found is None:
            return ()
        rest = found.group(0).partition("://")[2]
    at = _userinfo_end(rest)
    if at == -1:
        return ()
    password = rest[:at].partition(":")[2]
    return tuple(piece for piece in re.split(r"[#?/@\s]", password) if len(piece) >= 3)

