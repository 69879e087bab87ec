"""Memory systems as contestants: anything that reads the book and, asked a
question, returns evidence (passages with their chapter) or its own answer.

- `contract`: the one contract every memory system keeps (Python class or
  subprocess speaking JSON lines), and the services Tulving offers it;
- `builtin`: the paper's modes (in-context, rag-paragraph, rag-chapter,
  finetuned) and the no-memory baseline, expressed through that contract;
- `registry`: which memory systems exist (built-ins, the `tulving.memories`
  entry points, `[memories.NAME]` commands of the config);
- `subprocess_memory`: the JSON-lines protocol (docs/memory-systems.md);
- `budget`: the run's evidence budget and what it cuts;
- `services`: model calls of a memory system through the engine, per phase;
- `meter`: the cost and latency of every phase;
- `runner`: one memory system through open, ingest, ready, recall and close.
"""
