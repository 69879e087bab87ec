"""A memory system as a subprocess, for tests of the JSON-lines protocol:

    python tests/memory_process.py MODE

It keeps every chapter and recalls by word overlap. Every line it receives is
written to WORKDIR/received.jsonl as it came (bytes), every reply to
WORKDIR/sent.jsonl, and its environment to WORKDIR/environment.json, so tests
see exactly what crossed. MODE is "good",
or a fault: crash-on-ingest, hang-on-ready, not-json, unknown-id, wrong-reply,
unknown-type, error-on-open, recall-error (an error reply for questions holding
"FAIL"), ignore-close (never exits: killed after the grace), stdout-noise
(prints a banner before its first reply), call-endpoint (one chat call
through Tulving's endpoint with an unmodified openai client at ingest),
no-opened (exits at once, saying why on stderr), slow-recall (each recall
answered 0.3 s late), summarize-each (one chat call through Tulving's
endpoint per chapter at ingest, its summary kept and recalled beside it)."""
import json
import os
import re
import sys
import time

MODE = sys.argv[1]
WORDS = re.compile(r"[a-z0-9]+")


def send(message: dict) -> None:
    line = json.dumps(message) + "\n"
    with open(os.path.join(os.environ["TULVING_MEMORY_WORKDIR"], "sent.jsonl"), "a") as sent:
        sent.write(line)
    sys.stdout.write(line)
    sys.stdout.flush()


def words(text: str) -> set[str]:
    return set(WORDS.findall(text.lower()))


def recall(chapters: dict[int, str], message: dict) -> dict:
    asked = words(message["question"])
    ranked = sorted(chapters, key=lambda k: (-len(asked & words(chapters[k])), k))
    limit = message["budget"]["passages"] or len(ranked)
    passages = [{"chapter": k, "text": chapters[k][:200], "score": len(asked & words(chapters[k]))}
                for k in ranked[:limit]]
    return {"type": "recalled", "id": message["id"], "passages": passages, "answer": None}


def call_endpoint(opened: dict) -> None:
    import openai  # configured by the environment alone: OPENAI_BASE_URL, OPENAI_API_KEY

    reply = openai.OpenAI(max_retries=0).chat.completions.create(
        model=opened["models"]["chat"], messages=[{"role": "user", "content": "Where did Ana meet Bo?"}])
    print(f"endpoint replied {len(reply.choices[0].message.content)} characters", file=sys.stderr)


def summarize_each(opened: dict, chapters: list) -> None:
    import openai

    client = openai.OpenAI(max_retries=2)
    for chapter in chapters:
        client.chat.completions.create(model=opened["models"]["chat"], messages=[
            {"role": "user", "content": f"Summarize in one sentence:\n\n{chapter['text']}"}])
        print(f"summarized chapter {chapter['id']}", file=sys.stderr, flush=True)


def handle(message: dict, state: dict) -> None:
    kind = message["type"]
    if kind == "open":
        state["open"] = message
        if MODE == "error-on-open":
            send({"type": "error", "message": "no index folder configured"})
            return
        if MODE == "stdout-noise":
            print("Loading memory backend v0.1 ...")
        send({"type": "opened", "answers": False, "concurrency": 3})
        if MODE == "deaf-after-open":  # stops reading its stdin: Tulving's writes fill the pipe
            time.sleep(3600)
    elif kind == "ingest":
        if MODE == "crash-on-ingest":
            print("Traceback (most recent call last):\nIndexError: list index out of range", file=sys.stderr)
            sys.exit(3)
        if MODE == "call-endpoint":
            call_endpoint(state["open"])
        if MODE == "summarize-each":
            summarize_each(state["open"], message["chapters"])
        state["chapters"].update({c["id"]: c["text"] for c in message["chapters"]})
        send({"type": "ingested"})
    elif kind == "ready":
        if MODE == "hang-on-ready":
            time.sleep(3600)
        send({"type": "ingested" if MODE == "wrong-reply" else "ready"})
    elif kind == "recall":
        handle_recall(message, state)
    elif kind == "close":
        send({"type": "closed"})
        if MODE == "ignore-close":
            time.sleep(3600)
        sys.exit(0)


def handle_recall(message: dict, state: dict) -> None:
    if MODE == "not-json":
        sys.stdout.write("{'type': 'recalled'}\n")
        sys.stdout.flush()
    elif MODE == "unknown-id":
        send({**recall(state["chapters"], message), "id": message["id"] + "x"})
    elif MODE == "unknown-type":
        send({"type": "thinking", "id": message["id"]})
    elif MODE == "recall-error" and "FAIL" in message["question"]:
        send({"type": "error", "id": message["id"], "message": "the index timed out on this one"})
    else:
        if MODE == "slow-recall":
            time.sleep(0.3)
        send(recall(state["chapters"], message))


def main() -> None:
    if MODE == "no-opened":
        print("memory backend: cannot find its model file", file=sys.stderr)
        sys.exit(2)
    workdir = os.environ["TULVING_MEMORY_WORKDIR"]
    with open(os.path.join(workdir, "environment.json"), "w") as out:
        json.dump(dict(os.environ), out)
    state: dict = {"chapters": {}}
    with open(os.path.join(workdir, "received.jsonl"), "ab") as received:
        for line in sys.stdin.buffer:
            received.write(line)
            received.flush()
            handle(json.loads(line), state)


if __name__ == "__main__":
    main()
