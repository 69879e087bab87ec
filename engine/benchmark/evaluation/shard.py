"""`tulving run --shard i/n`: a deterministic share of a run's work.

The (model, mode, question) triples of the planned jobs are put in one order
that does not depend on how the command line listed them (sorted by model,
mode, question index) and dealt round-robin: triple k goes to shard
(k mod n) + 1. Each shard is then an ordinary run of its share (its own run
folder, its own cache); `tulving report SHARD_DIR...` merges the folders
(runset.py) into the tables of the unsplit run, and `tulving cache export` /
`cache import` merge the caches (entries are content-addressed: the same
request has the same key on every machine, so nothing conflicts).

A job keeps its `sample` marker: a shard of a full job is still part of a
full job. Jobs left without a question in a shard are dropped from it.
RAG retrieval still ranks chunks for the full question set, as unsplit.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from engine.benchmark.evaluation.pipeline import Job
from providers.base import TulvingError


def parse_shard(text: str) -> tuple[int, int]:
    """"2/3" -> (2, 3); 1 <= i <= n."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise TulvingError(f"--shard takes i/n (e.g. 1/3), not {text!r}")
    i, n = int(match.group(1)), int(match.group(2))
    if n < 1 or not 1 <= i <= n:
        raise TulvingError(f"--shard {text}: i must be between 1 and n")
    return i, n


def shard_jobs(jobs: Sequence[Job], index: int, count: int) -> list[Job]:
    """The share of shard `index` (1-based) of `count`."""
    triples = sorted((job.model, job.mode, q.q_idx) for job in jobs for q in job.questions)
    mine = {t for k, t in enumerate(triples) if k % count == index - 1}
    out = []
    for job in jobs:
        questions = [q for q in job.questions if (job.model, job.mode, q.q_idx) in mine]
        if questions:
            out.append(Job(model=job.model, mode=job.mode, questions=questions, sample=job.sample))
    return out
