"""Where a cache is: a `postgresql://` URL or a SQLite path, and how to
print it (a URL's password never leaves this process in a message)."""
from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit, urlunsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")
def is_postgres_url(location: str | os.PathLike[str]) -> bool:
    text = os.fspath(location)
    return isinstance(text, str) and text.split("://", 1)[0].lower() in POSTGRES_SCHEMES and "://" in text


def redact(location: str | os.PathLike[str]) -> str:
    """`location` fit to print: a URL's password replaced by `***` (also a
    `password=` query parameter); a path as it is."""
    text = os.fspath(location)
    if not isinstance(text, str) or not is_postgres_url(text):
        return str(text)
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = "&".join("password=***" if q.lower().startswith("password=") else q
                         for q in parts.query.split("&")) if parts.query else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return f"{text.split('://', 1)[0]}://***"


def split_password(url: str) -> tuple[str, str | None]:
    """(`url` without its password, the password or None). A password given
    apart (in $PGPASSWORD) keeps it out of every message, log and report."""
    if not is_postgres_url(url):
        return url, None
    try:
        parts = urlsplit(url)
        password = parts.password
        netloc = parts.netloc
        if password is not None:
            userinfo, host = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}@{host}"
        query = [q for q in parts.query.split("&") if q and not q.lower().startswith("password=")]
        if password is None and len(query) != len([q for q in parts.query.split("&") if q]):
            password = next(unquote(q.split("=", 1)[1]) for q in parts.query.split("&")
                            if q.lower().startswith("password="))
        elif password is not None:
            password = unquote(password)
        return urlunsplit((parts.scheme, netloc, parts.path, "&".join(query), parts.fragment)), password
    except ValueError:
        return url, None
