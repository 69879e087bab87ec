"""CLI: `tulving memories`: the memory systems a run can name (`--modes`,
`--memory`), where each comes from, whether it answers itself, and whether
it can run here (an adapter whose package is not installed says which).

    tulving memories [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.cli.commands import command_help
from engine.cli.config_file import load_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("memories", help=command_help("memories"),
                       description="List the memory systems: the paper's modes and the no-memory baseline, the "
                                   "installed ones (entry point group tulving.memories), and the config's "
                                   "[memories.NAME] tables. See docs/memory-systems.md.")
    p.add_argument("--json", action="store_true", help="one JSON object per system")
    p.set_defaults(func=cmd_memories)


def cmd_memories(args: argparse.Namespace) -> int:
    config = load_config(args)
    from engine.benchmark.memory.registry import make_memory, memory_specs

    rows = []
    for name, spec in sorted(memory_specs(config.memories).items()):
        try:
            system = make_memory(spec)
            problem, answers, about = system.unavailable(), system.answers, system.description
        except Exception as exc:  # a broken third-party entry point is listed, not fatal
            problem, answers, about = f"cannot be loaded ({type(exc).__name__}: {exc})", False, ""
        rows.append({"name": name, "origin": spec.origin, "answers": "itself (agent)" if answers else "evidence",
                     "runs": "yes" if problem is None else f"no: {problem}", "description": about})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    head = ["name", "gives", "can run", "from", "what it is"]
    table = [[r["name"], r["answers"], r["runs"], r["origin"], r["description"]] for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *table)]
    for cells in [head, ["-" * w for w in widths], *table]:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    print("\nUse: tulving run --models M --modes no-memory,rag-paragraph --memory NAME  (docs/memory-systems.md)",
          file=sys.stderr)
    return 0
