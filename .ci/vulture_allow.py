"""Names the dead-code check (vulture, run by .ci/run) cannot see used, and why.

Anything else it reports has no caller anywhere, tests included: delete it.
Each line below names what uses these names where vulture does not look."""
# ruff: noqa: B018, F821 -- a list of names, read by vulture, never run
_ = object()

# Looked up by name: entry points in pyproject.toml, ProviderKind strings, module __getattr__.
(OPENAI, ANTHROPIC, LOCAL, LOCAL_EMBED, GEMINI, AZURE_OPENAI, BUILTIN, AzureOpenAIProvider, InstantProvider)
(__getattr__, _commit_at_exit)  # PEP 562 module attribute; @atexit.register
EXIT_OK  # the table of exit codes (engine/errors.py) lists every code, 0 included

# Called by the libraries: httptools' parser callbacks, asyncio.Transport's and aiohttp's connector methods,
# http.server and uvicorn/hypercorn settings, sqlite3 and aiohttp attributes set for their readers.
(_.on_header, _.on_headers_complete, _.on_body, _.on_message_complete, _._create_connection)
(_.can_write_eof, _.is_reading, _.get_write_buffer_size, _.get_write_buffer_limits, _.set_write_buffer_limits)
(_.set_protocol, _.get_protocol, _.do_GET, _.log_message, _.close_connection)
(_.should_exit, _.keep_alive_timeout, _.accesslog, _.errorlog, _.text_factory, _.content_length, _.charset)
pytestmark
(option_string, signum, exc_type, tb)  # parameters fixed by argparse.Action, signal handlers, __aexit__

# Fields of records written out whole (JSON via asdict or TypedDict): scores, reports, spending, tables, wire shapes.
(_.n_chunks, _.p_two_sided, _.p_non_realistic_higher, _.answer_errors, _.incomplete, _.judge_failures)
(_.judge_redraws, _.cost_usd, _.wall_seconds, _.chronological_asked, _.simple_recall_ci)
(_.chronological_awareness_ci, _.label_columns, _.secondary_entities, _.idx_paragraph, _.lag_samples)
(_.post_entities, _.raw_generated_paragraph_idx, _.bins_items_correct_answer, _.correct_answer_chapters)
(_.n_chapters_correct_answer, _.list_usd, _.caching_saved_usd)
(_.thought, _.finishReason, _.usageMetadata, _.modelVersion, _.responseId, _.displayName, _.inputConfig)
(_.createTime)
(_.file_bytes, _.iteration, _.failed_exact, _.failed_llm, _.iterations, _.positions_plot)  # cache stats, stats.json

# Memory systems, found through the tulving.memories entry points (pyproject.toml) or a library's attributes.
(InContextMemory, FinetunedMemory, NoMemory, BuiltinProvider)
(_.MEM0_TELEMETRY, _._load_failed_full, _._load_failed_lemma)  # set on os.environ and on spaCy's loader for mem0
(cmd_bundle, cmd_verify, cmd_leaderboard, cmd_export)  # engine/cli/publish.py names them as strings (_handler)
_.__traceback__  # cleared to free the frames a failed call held (engine/dispatch.py without_frames)
# Fields of run.json, scores.json and results.jsonl written whole (TypedDicts, asdict).
(_.cut_questions, _.recall_latency, _.evidence_cut_tokens, _.answer_seconds, _.scores_version)
(_.paid_no_answer, _.reported_usd, _.table_usd)
