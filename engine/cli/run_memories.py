"""The memory systems of `tulving run`: which ones, their settings, and what
run.json keeps of them.

    plan = memory_plan(args, config)            # --modes + --memory, checked by name
    settings = memory_settings(args, plan, out, models, embed_model)
    memory_record(evaluation, plan)             # run.json's "memory"
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.benchmark.evaluation.memory_report import BudgetRecord, EvidenceRecord, MemoryEntry
from engine.benchmark.evaluation.pipeline import AGENT, Evaluation, Job
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.memory.budget import Evidence
from engine.benchmark.memory.contract import Budget, MemorySpec
from engine.benchmark.memory.meter import percentiles
from engine.benchmark.memory.registry import make_memory, memory_specs, pick
from engine.benchmark.memory.runner import Prepared
from engine.benchmark.memory.session import MemorySettings, is_builtin
from engine.config import Config
from providers.base import TulvingError


@dataclass(slots=True)
class MemoryPlan:
    """The run's memory systems by name (--modes first, then --memory)."""

    specs: dict[str, MemorySpec]
    names: list[str]
    agents: set[str]  # the systems that answer themselves: one job each, model "agent"


def memory_plan(args: argparse.Namespace, config: Config, modes: Sequence[str]) -> MemoryPlan:
    """Every named system known and able to run here, or one line saying
    which is not (with a guess for a typo, or what is missing)."""
    specs = memory_specs(config.memories, dict(getattr(args, "memory_command", None) or []))
    names = list(dict.fromkeys([*modes, *(getattr(args, "memory", None) or [])]))
    agents = set()
    for spec in pick(names, specs):
        system = make_memory(spec)
        problem = system.unavailable()
        if problem:
            raise TulvingError(f"memory system {spec.name!r} cannot run here: {problem}")
        if system.answers:
            agents.add(spec.name)
    return MemoryPlan(specs=specs, names=names, agents=agents)


def plan_memory_jobs(plan: MemoryPlan, jobs: list[Job], questions: Sequence[Question]) -> list[Job]:
    """`jobs` (models x memories) with each agent-style system's jobs made
    one: the system wrote the answers, whichever model was asked for."""
    kept = [j for j in jobs if j.mode not in plan.agents]
    for name in plan.names:
        if name in plan.agents:
            first = next((j for j in jobs if j.mode == name), None)
            kept.append(dataclasses.replace(first, model=AGENT) if first is not None
                        else Job(model=AGENT, mode=name, questions=list(questions)))
    return kept


def run_budget(args: argparse.Namespace) -> Budget | None:
    """What --evidence-passages / --evidence-tokens set (None: the paper's
    budget whole); the session counts it in each answering model's tokenizer
    and fills what is unset with the paper's figures in that tokenizer."""
    passages, tokens = getattr(args, "evidence_passages", None), getattr(args, "evidence_tokens", None)
    return Budget(passages=passages, tokens=tokens) if passages or tokens else None


def memory_settings(args: argparse.Namespace, plan: MemoryPlan, out: Path, models: Sequence[str],
                    embed_model: str | None) -> MemorySettings:
    readers = [m for m in models if m != AGENT]
    chat = getattr(args, "memory_model", None) or (readers[0] if readers else None)
    return MemorySettings(specs=plan.specs, workdir=out / "memory", chat_model=chat, embed_model=embed_model,
                          budget=run_budget(args))


def memory_identity(args: argparse.Namespace, plan: MemoryPlan) -> dict[str, object]:
    """What of the memory systems makes a run's results what they are (run.json's configuration)."""
    outside = [n for n in plan.names if not is_builtin(plan.specs[n])]
    if not outside and not getattr(args, "evidence_passages", None) and not getattr(args, "evidence_tokens", None):
        return {}
    return {"memory": {n: {"origin": plan.specs[n].origin, "options": plan.specs[n].options} for n in outside},
            "memory_model": getattr(args, "memory_model", None),
            "evidence_passages": getattr(args, "evidence_passages", None),
            "evidence_tokens": getattr(args, "evidence_tokens", None)}


def _evidence_figures(evidence: Sequence[Evidence]) -> EvidenceRecord:
    kept = [e for e in evidence if e.error is None]
    return {"questions": len(evidence), "failed": len(evidence) - len(kept),
            "tokens": percentiles([float(e.tokens) for e in kept]),
            "passages": percentiles([float(len(e.passages)) for e in kept]),
            "cut_questions": sum(1 for e in kept if e.cut_passages),
            "cut_passages": sum(e.cut_passages for e in kept), "cut_tokens": sum(e.cut_tokens for e in kept)}


def _budget_record(budget: Budget) -> BudgetRecord:
    return {"passages": budget.passages, "tokens": budget.tokens, "tokenizer": budget.tokenizer}


def prepared_record(prepared: Prepared, spec: MemorySpec | None) -> MemoryEntry:
    """One memory system in run.json: where it came from, the budget it was
    handed and each answering model's (in its tokenizer), each phase's time,
    calls and dollars, recall latency, evidence size and cuts (in the handed
    budget's tokenizer)."""
    meter = prepared.meter.to_json()
    readers: dict[str, BudgetRecord] = {}
    for model in sorted(prepared.readers):
        budget = prepared.budget_of(model)
        if budget is not None:
            readers[model] = _budget_record(budget)
    return {"origin": spec.origin if spec else None, "prompt": prepared.prompt, "answers": prepared.answers,
            "budget": _budget_record(prepared.budget) if prepared.budget else None, "budgets": readers,
            "phases": meter["phases"], "recall_latency": meter["recall_latency"],
            "evidence": _evidence_figures(list(prepared.evidence.values())),
            "failure": prepared.failure}


def memory_record(evaluation: Evaluation, plan: MemoryPlan | None) -> dict[str, MemoryEntry]:
    specs = plan.specs if plan is not None else {}
    return {name: prepared_record(p, specs.get(name)) for name, p in sorted(evaluation.memory.items())}


def memory_failures(evaluation: Evaluation) -> list[str]:
    """One line per memory system that failed (its questions are unanswered)."""
    return [p.failure for p in evaluation.memory.values() if p.failure]
