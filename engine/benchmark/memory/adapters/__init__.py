"""Memory systems nobody here wrote, as Tulving contestants: each a
MemorySystem subclass declared in pyproject.toml's entry point group
`tulving.memories` and installed by its extra (`tulving-bench[mem0]`,
`[lancedb]`, ...). Their libraries are imported in `open()`, never when this
package is imported, so `tulving memories` lists them whether or not they are
installed (docs/memory-systems-adapters.md)."""
