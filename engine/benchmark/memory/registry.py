"""Which memory systems exist, and making one by name.

Three sources, one namespace:
- the entry point group `tulving.memories`: each entry names a
  MemorySystem subclass (or a factory called as `factory(name=, options=)`);
  Tulving's own systems (the paper's modes, no-memory, the adapters of
  mem0 and others) are declared there exactly as a third-party package
  declares its own;
- the config file's `[memories.NAME]` tables: `command = ["./my-memory",
  "--flag"]` for a subprocess speaking the JSON-lines protocol, or
  `use = "ENTRY"` for an installed system under another name with options
  (any other key of the table is an option: `use = "mem0"`, `infer = true`);
- `tulving run --memory-command NAME=COMMAND`: a subprocess, ad hoc.
"""
from __future__ import annotations

import difflib
import shlex
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points

from engine.benchmark.memory.contract import MemorySpec, MemorySystem
from providers.base import TulvingError

GROUP = "tulving.memories"
_RESERVED = ("command", "use")


def _entry_specs(found: Iterable[EntryPoint]) -> dict[str, MemorySpec]:
    return {ep.name: MemorySpec(name=ep.name, origin=f"entry point {ep.value}", make=ep) for ep in found}


def _command(name: str, value: object) -> list[str]:
    argv = shlex.split(value) if isinstance(value, str) else value
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise TulvingError(f"[memories.{name}] command must be a command line or a list of strings")
    return argv


def _config_spec(name: str, table: object, installed: Mapping[str, MemorySpec]) -> MemorySpec:
    if not isinstance(table, dict):
        raise TulvingError(f"[memories.{name}] must be a table")
    options = {k: v for k, v in table.items() if k not in _RESERVED}
    if "command" in table:
        if "use" in table:
            raise TulvingError(f"[memories.{name}] gives both command and use: pick one")
        argv = _command(name, table["command"])
        return MemorySpec(name=name, origin=f"command {shlex.join(argv)}", options=options, command=argv)
    used = table.get("use")
    if not isinstance(used, str):
        raise TulvingError(f"[memories.{name}] needs command = [...] (a subprocess) or use = \"NAME\" "
                           f"(an installed memory system)")
    base = installed.get(used)
    if base is None or base.command is not None:
        raise TulvingError(f"[memories.{name}] uses {used!r}, which is not an installed memory system"
                           f"{_did_you_mean(used, installed)} (`tulving memories` lists them)")
    return MemorySpec(name=name, origin=f"{used} with options", make=base.make, options={**base.options, **options})


def memory_specs(config_tables: Mapping[str, object] | None = None, commands: Mapping[str, str] | None = None,
                 found: Iterable[EntryPoint] | None = None) -> dict[str, MemorySpec]:
    """Every memory system by name: entry points, then the config's tables,
    then ad-hoc commands (a later source may not reuse an earlier name)."""
    specs = _entry_specs(entry_points(group=GROUP) if found is None else found)
    installed = dict(specs)
    for name, table in (config_tables or {}).items():
        if name in specs:
            raise TulvingError(f"[memories.{name}]: {name!r} is already an installed memory system; pick another name")
        specs[name] = _config_spec(name, table, installed)
    for name, command in (commands or {}).items():
        if name in specs:
            raise TulvingError(f"--memory-command {name}=...: {name!r} is already a memory system; pick another name")
        specs[name] = MemorySpec(name=name, origin=f"command {command}", command=_command(name, command))
    return specs


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def make_memory(spec: MemorySpec) -> MemorySystem:
    """The system `spec` names, made (its heavy imports wait for open())."""
    if spec.command is not None:
        from engine.benchmark.memory.subprocess_memory import SubprocessMemory

        made: MemorySystem = SubprocessMemory(name=spec.name, options={**spec.options, "command": list(spec.command)})
        return made
    target = spec.make.load() if isinstance(spec.make, EntryPoint) else spec.make
    if not callable(target):
        raise TulvingError(f"memory system {spec.name!r} ({spec.origin}) is not a class or factory")
    system: object = target(name=spec.name, options=dict(spec.options))
    if not isinstance(system, MemorySystem):
        raise TulvingError(f"memory system {spec.name!r} ({spec.origin}) made a {type(system).__name__}, "
                           f"not a MemorySystem")
    return system


def pick(names: Iterable[str], specs: Mapping[str, MemorySpec]) -> list[MemorySpec]:
    """The specs of `names`, or one line for an unknown name (with a guess)."""
    picked = []
    for name in names:
        spec = specs.get(name)
        if spec is None:
            raise TulvingError(f"unknown memory system {name!r}{_did_you_mean(name, specs)} "
                               f"(`tulving memories` lists them; a subprocess: --memory-command {name}=COMMAND)")
        picked.append(spec)
    return picked
