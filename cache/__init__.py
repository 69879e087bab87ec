"""The content-addressed response cache: keys (cache/keys.py), the SQLite
store (cache/store.py: `ResponseCache`), its file codec (cache/codec.py,
cache/chunks.py) and maintenance (cache/admin.py; `tulving cache ...` is engine/cli/cache.py)."""
