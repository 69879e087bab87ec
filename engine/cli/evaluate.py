"""CLI: `tulving run`, `tulving questions`, `tulving finetune`, `tulving report`.

    tulving run [--book B] [--models M1,M2] [--modes in-context,rag-paragraph]
                [--judge J] [--embed-model E] [--out DIR] [--local-sample N] [--dry-run]
    tulving questions --book B --out questions.jsonl
    tulving finetune --book B --model gpt-4o-mini-2024-07-18 --endpoint openai [--data-out F]
    tulving report RUN_DIR
    tulving report RUN_DIR... --out DIR        (report_folder.py: index.html, tables, figures)
    tulving run ... --shard I/N                (shard.py: one machine's share of the run)
    tulving compare RUN_A RUN_B [--out DIR]    (compare.py: the test that fits, and which)
    tulving agreement RUN_A RUN_B [--out DIR]  (agreement.py: two judges on the same answers)

`tulving run` with no model or mode is the built-in offline default: the
published short book, `builtin:reader` in-context and (when the offline
MiniLM embedder works) on rag-paragraph, judged by `builtin:judge`; plus the
local SmolLM2 on rag-paragraph over a sample of questions when
llama-cpp-python is installed. SmolLM2 took 10 to 40 s a question on 2 shared
cores (its ~1,300-token RAG prompts), so the default run gives it only
DEFAULT_LOCAL_SAMPLE (1) question of the set -- `--local-sample N`
for more -- and the leaderboard marks such runs as samples, listed last. The
whole default run took 33 s (machine load ~2) to 112 s (load ~3+) here.

A run folder holds:
- results.jsonl: one line per (model, mode, question) -- see results.py;
  identical bytes when the same run is replayed from the cache;
- scores.json: per (model, mode) the scores, bin means, counts, judge
  failures, calls, cache hits and cost (see report.py);
- report.md: the leaderboard and the paper's F1-by-bin table;
- run.json: what is specific to this execution (wall time, calls made, cache hits).

This module only parses: the work is in engine/cli/evaluate_handlers.py,
imported once the options (and, for `run` and `finetune`, the config) are
read, so that `tulving run --help` and a bad config answer at once.
"""
from __future__ import annotations

import argparse

from engine.benchmark.evaluation import answers as A
from engine.cli.argtypes import add_allow_unpriced, csv_list, non_negative_float, positive_int
from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.cli.evaluate_defaults import (
    DEFAULT_BOOK,
    DEFAULT_EMBED,
    DEFAULT_JUDGE,
    DEFAULT_LOCAL_SAMPLE,
    LOCAL_LLM,
    OFFLINE_EMBED,
)
from providers.base import TulvingError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_run(subparsers)
    p = subparsers.add_parser("questions", help=command_help("questions"))
    p.add_argument("--book", default=DEFAULT_BOOK, help="published book name or book folder")
    p.add_argument("--out", metavar="FILE", help="questions file to write (.jsonl; -: standard output); required "
                                                 "without --ids")
    p.add_argument("--ids", action="store_true",
                   help="give each question its stable id (q<index>-<digest of book and question>, the id an "
                        "answers file names for `tulving score`): in each line of --out, or without --out one "
                        "'ID<TAB>question' line per question on standard output")
    p.set_defaults(func=cmd_questions)
    _register_finetune(subparsers)
    _register_reports(subparsers)


def _register_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run", help=command_help("run"),
        description="Answer every question of a book with each model and memory mode, judge the answers, "
                    "score them and write results.jsonl, scores.json, report.md and run.json to --out. "
                    "Without --models/--modes: the offline built-in default (builtin:reader, builtin:judge, "
                    "local models when installed).")
    p.add_argument("--book", default=DEFAULT_BOOK,
                   help="published book name (synaptic-echoes, synaptic-echoes-short) or book folder "
                        "(default %(default)s)")
    p.add_argument("--questions", metavar="FILE", help="questions JSONL (default: built from the book)")
    p.add_argument("--models", type=csv_list, help="comma-separated model aliases")
    p.add_argument("--modes", type=csv_list, help=f"comma-separated memory modes: {', '.join(A.MODES)} "
                                              "(default in-context, unless --memory is given)")
    _add_memory_options(p)
    p.add_argument("--judge", default=DEFAULT_JUDGE, help="judge model alias (default %(default)s)")
    p.add_argument("--embed-model", help=f"embedding model alias for RAG modes (default {DEFAULT_EMBED}; "
                                         f"{OFFLINE_EMBED} offline)")
    p.add_argument("--out", metavar="DIR", help="run folder (default runs/<book>); one holding a run of another "
                                                "configuration is refused (see --overwrite), one of the same "
                                                "configuration is resumed")
    p.add_argument("--local-sample", type=positive_int, metavar="N",
                   help=f"run {LOCAL_LLM} on N questions spread over the set "
                        f"(default run: {DEFAULT_LOCAL_SAMPLE}; else all)")
    p.add_argument("--sample", type=positive_int, metavar="N",
                   help="run every model on N questions spread over the set")
    p.add_argument("--dry-run", action="store_true", help="print the calls the run needs, how many the cache "
                                                         "holds and what the rest would cost; call nothing")
    p.add_argument("--batch", action="store_true",
                   help="send uncached chat calls to openai/anthropic endpoints through their batch APIs "
                        "(half the price, results within 24 h); a killed run, rerun, resumes its batches")
    p.add_argument("--temperature", type=non_negative_float,
                   help="sampling temperature of the answering models (default: each alias's params)")
    p.add_argument("--max-tokens", type=positive_int, metavar="N",
                   help="output-token limit of the answering models (default: each alias's params)")
    p.add_argument("--repeats", type=positive_int, default=1, metavar="N",
                   help="ask every answer N times as independent draws (cached apart), each judged and scored: "
                        "the report gives the run-to-run spread (default %(default)s)")
    add_allow_unpriced(p)
    p.add_argument("--max-cost-scope", choices=["run", "invocation"], default="run",
                   help="what --max-cost bounds: the run's whole spending, what earlier invocations of the same "
                        "configuration paid through this cache included, from any --out (default; `tulving cache "
                        "spending` lists it), or this invocation's alone")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run --out holds even when it is of another configuration")
    p.add_argument("--shard", type=_shard_arg, metavar="I/N",
                   help="run only shard I of N: a deterministic share of the (model, mode, question) jobs, "
                        "for splitting a run across machines (merge with tulving report SHARD_DIR... --out)")
    p.set_defaults(func=cmd_run)


def _add_memory_options(p: argparse.ArgumentParser) -> None:
    """--memory and the options of memory systems (docs/memory-systems.md)."""
    p.add_argument("--memory", type=csv_list, metavar="NAME[,NAME...]",
                   help="memory systems to evaluate beside --modes (`tulving memories` lists them: installed "
                        "ones, [memories.NAME] tables of the config, --memory-command); each reads the book and "
                        "gives each answering model its evidence, or answers itself (agent style)")
    p.add_argument("--memory-command", action="append", type=_memory_command, default=[], metavar="NAME=COMMAND",
                   help="a memory system run as a subprocess speaking JSON lines (docs/memory-systems.md); "
                        "repeatable; name it in --memory")
    p.add_argument("--memory-model", metavar="ALIAS",
                   help="chat model the memory systems may call through Tulving (default: the first of --models); "
                        "their embeddings use --embed-model")
    p.add_argument("--evidence-passages", type=positive_int, metavar="N",
                   help="the evidence budget: passages a memory system may return per question (default: the "
                        "paper's rag-paragraph top-K)")
    p.add_argument("--evidence-tokens", type=positive_int, metavar="N",
                   help="the evidence budget: tokens of those passages, in each answering model's tokenizer "
                        "(default: the most the paper's RAG modes give on the book, in that tokenizer)")


def _register_finetune(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "finetune", help=command_help("finetune"),
        description="Write the single-event question/answer pairs as chat JSONL, submit an OpenAI "
                    "fine-tuning job, wait for it, record the fine-tuned model id and print the config "
                    "snippet that declares it as a model alias (use it with --modes finetuned).")
    p.add_argument("--book", default=DEFAULT_BOOK, help="published book name or book folder")
    p.add_argument("--model", required=True, help="base model to fine-tune, e.g. gpt-4o-mini-2024-07-18")
    p.add_argument("--endpoint", default="openai", help="OpenAI-compatible endpoint from the config "
                                                        "(default %(default)s)")
    p.add_argument("--data-out", metavar="FILE", help="training data file (default runs/finetune/<book>.jsonl)")
    p.add_argument("--record", metavar="FILE", help="JSON file recording the job and model id "
                                                     "(default: next to the data, .model.json)")
    p.add_argument("--alias", help="alias name for the fine-tuned model (default ft:<book>)")
    p.add_argument("--suffix", help="model name suffix sent to the API")
    p.add_argument("--data-only", action="store_true", help="write the training data, submit nothing")
    p.add_argument("--epochs", type=int, default=30, help="training epochs (paper: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (paper: %(default)s)")
    p.add_argument("--lr-multiplier", type=float, default=1.8, help="learning-rate multiplier (paper: %(default)s)")
    p.add_argument("--poll-interval", type=float, default=30.0, help="seconds between job polls")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="give up after this many seconds")
    p.set_defaults(func=cmd_finetune)


def _register_reports(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """report, compare, agreement: commands that read finished runs."""
    p = subparsers.add_parser(
        "report", help=command_help("report"),
        description="With one RUN_DIR and no --out: re-render its scores.json and report.md. With --out DIR: "
                    "write the report of one or more runs (different models, modes, books, judges, or the "
                    "shards of one run) to DIR: index.html (self-contained), report.md, tables/ (Markdown "
                    "and CSV), figures/ (PNG and SVG), scores.json.")
    p.add_argument("run_dir", nargs="+", help="run folder(s) holding results.jsonl")
    p.add_argument("--out", metavar="DIR", help="report folder to write (index.html, tables, figures)")
    p.add_argument("--realism", metavar="FILE",
                   help="realism.json of the book (`tulving book realism`): adds the realistic vs non-realistic "
                        "split and its test, per configuration (default: the realism.json of each run's book folder, when there "
                        "is one)")
    p.add_argument("--no-figures", action="store_true",
                   help="with --out: write the tables, index.html, drill-down and report.md without drawing the "
                        "figures (no matplotlib; seconds faster); the report says they were left out")
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser(
        "compare", help=command_help("compare"),
        description="Same questions on both sides: Wilcoxon signed-rank (pratt) and a paired bootstrap CI of the "
                    "mean F1 difference (Gardner-Altman figure with --out). Different books: one-sided "
                    "Mann-Whitney U (A higher than B). The command says which test it used. When the book's "
                    "chapters are rated (--realism, or realism.json in its folder), each side's realistic and "
                    "non-realistic questions are compared too, as the paper's realism ablation; with RUN_A alone, "
                    "only that.")
    p.add_argument("run_a", help="run folder A (several shards: separate with commas)")
    p.add_argument("run_b", nargs="?",
                   help="run folder B (several shards: separate with commas); without it, the realism ablation "
                        "of RUN_A's configurations")
    p.add_argument("--a", metavar="MODEL/MODE", help="configuration of A when its run holds several")
    p.add_argument("--b", metavar="MODEL/MODE", help="configuration of B when its run holds several")
    p.add_argument("--get", default="all", choices=["all", "latest", "chronological", "any"],
                   help="questions compared (default %(default)s: simple recall)")
    p.add_argument("--resamples", type=positive_int, default=10_000, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default %(default)s)")
    p.add_argument("--realism", metavar="FILE",
                   help="realism.json of the book (`tulving book realism`): split the questions into realistic "
                        "and non-realistic chapters and test the difference (default: the book folder's "
                        "realism.json when there is one)")
    p.add_argument("--out", metavar="DIR", help="write compare.md, compare.json and the figure here")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser(
        "agreement", help=command_help("agreement"),
        description="Pairs the questions of configurations present under two judges: Pearson, Spearman, mean "
                    "absolute F1 difference, share of identical item sets, the largest disagreements; with "
                    "--out the tables (Markdown, CSV) and a scatter plot.")
    p.add_argument("run_dir", nargs="+", help="run folders (the same answers judged by different judges)")
    p.add_argument("--top", type=positive_int, default=20, help="disagreements listed per judge pair")
    p.add_argument("--out", metavar="DIR", help="write the tables and the scatter plot here")
    p.set_defaults(func=cmd_agreement)


def _memory_command(text: str) -> tuple[str, str]:
    name, sep, command = text.partition("=")
    if not sep or not name.strip() or not command.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=COMMAND, got {text!r}")
    return name.strip(), command.strip()


def _shard_arg(text: str) -> tuple[int, int]:
    from engine.benchmark.evaluation.shard import parse_shard

    try:
        return parse_shard(text)
    except TulvingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- handlers: the config first, then the modules that do the work ---------------------------

def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args)  # a bad config is told before numpy, scipy and aiohttp load
    from engine.cli.evaluate_handlers import cmd_run as run

    return run(args, config)


def cmd_finetune(args: argparse.Namespace) -> int:
    config = load_config(args)
    from engine.cli.evaluate_handlers import cmd_finetune as finetune

    return finetune(args, config)


def cmd_questions(args: argparse.Namespace) -> int:
    from engine.cli.evaluate_handlers import cmd_questions as questions

    return questions(args)


def cmd_report(args: argparse.Namespace) -> int:
    from engine.cli.evaluate_handlers import cmd_report as report

    return report(args)


def cmd_compare(args: argparse.Namespace) -> int:
    from engine.cli.evaluate_handlers import cmd_compare as compare

    return compare(args)


def cmd_agreement(args: argparse.Namespace) -> int:
    from engine.cli.evaluate_handlers import cmd_agreement as agreement

    return agreement(args)
