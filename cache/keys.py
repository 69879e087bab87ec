"""PLACEHOLDER (the cache helper replaces this): canonical request keys."""
import hashlib

import orjson


def request_key(identity: dict) -> str:
    return hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()
