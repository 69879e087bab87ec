"""Evaluation: questions, answers (in-context / RAG / fine-tuned), judging,
scores, and the `tulving run` pipeline that ties them together.

    questions.py  the question set of a book      answers.py   answering prompts per memory mode
    rag.py        chunks, embeddings, top-K       judge.py     judge prompts (judge_parse.py: replies)
    scores.py     F1, tau, the two scores         pipeline.py  book -> ... -> per-question records
    results.py    results.jsonl                   report.py    scores.json, leaderboard, tables
    finetune.py   fine-tuning data and job      (the CLI commands: engine/cli/evaluate.py)
"""

