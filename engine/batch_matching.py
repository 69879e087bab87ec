"""Which result of an ended batch answers which line, and what a line whose
answer cannot be told apart costs.

A batch API keys each result by the line's custom_id, and the engine joins on
it. When results come back without their key (the Gemini Batch API is
reported to leave `metadata.key` out of inlined responses:
googleapis/python-genai#2008, js-genai#1191; and to return them out of order:
python-genai#1909, so the position proves nothing), the provider still ran and
billed those lines. The rule: a request the provider accepted is paid for and
counted, whether or not its result can be used, and it is never sent again
while an earlier submission of it may be billed. So:

- a keyed result answers its line;
- keyless results are matched by elimination where that identifies the line
  (one line left without a result, one keyless result);
- otherwise the lines left are `UNMATCHED` (final: not sent again), each
  carrying in `ProviderError.billed` the usage of one keyless answer, so the
  budget, the spending ledger and the run's summary count what was billed
  (the batch's lines share one model, so which line gets which usage does not
  change the sum);
- a line with no result at all from a batch that ran to its end was billed
  too (its prompt is counted, at the estimate the batch was sized by); from
  a batch that failed, expired or was cancelled it was not, and goes out again.

    matcher = Matcher(endpoint, info, results)
    answers = matcher.answers(lines, missing_error)   # [(line, ChatResult | ProviderError)]
    matcher.unmatched                                  # how many lines were paid without an answer
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from providers.base import BAD_REPLY, UNMATCHED, ChatResult, ProviderError
from providers.batch_api import UNKEYED, BatchInfo, LineResult

WHAT_TO_DO = ("their requests are not sent again; run them without --batch (or with options.batch = false on "
              "this endpoint) to get their answers")


class LineLike(Protocol):
    """What matching reads of a batch line (engine/batching.py `Line`)."""

    key: str
    tokens: int


class Matcher:
    """The results of one ended batch, handed out to its lines."""

    def __init__(self, endpoint: str, info: BatchInfo, results: Mapping[str, LineResult]):
        self.endpoint, self.info, self.results = endpoint, info, results
        self.keyless = [result for key, result in results.items() if key.startswith(UNKEYED)]
        self.unmatched = 0   # lines paid for whose answer could not be told apart
        self.missing = 0     # lines the batch ran without giving back any result

    def answers(self, lines: Sequence[LineLike], missing: ProviderError) -> list[tuple[LineLike, LineResult]]:
        """Each line's result, or the error that settles it (`missing`: the
        error of a line an ended batch does not report, engine/batching.py)."""
        out: list[tuple[LineLike, LineResult]] = []
        left = []
        for line in lines:
            found = self.results.get(line.key)
            if found is None:
                left.append(line)
            else:
                out.append((line, found))
        if len(left) == 1 and len(self.keyless) == 1:  # the only line without an answer, the only answer
            out.append((left[0], self.keyless.pop()))
            return out
        ran = missing.kind == BAD_REPLY  # the batch ended normally: every line of it was run
        for line in left:
            if self.keyless:
                out.append((line, self._unmatched(line, self.keyless.pop(0))))
            elif ran:
                out.append((line, self._never_returned(line)))
            else:
                out.append((line, missing))
        return out

    def _unmatched(self, line: LineLike, result: LineResult) -> ProviderError:
        self.unmatched += 1
        error = ProviderError(UNMATCHED, f"{self.endpoint}: batch {self.info.id} returned an answer without the "
                                         f"key of its request (python-genai#2008): paid, not sent again")
        if isinstance(result, ChatResult):  # an errored line is not billed
            result.batched = True
            error.billed = result
        return error

    def _never_returned(self, line: LineLike) -> ProviderError:
        self.missing += 1
        error = ProviderError(UNMATCHED, f"{self.endpoint}: batch {self.info.id} ran this request but returned no "
                                         f"result for it: counted as paid (its prompt), not sent again")
        error.billed = ChatResult(text="", input_tokens=line.tokens, batched=True)
        return error

    def notice(self) -> str | None:
        """The one line for the user, or None when every line was matched."""
        if not self.unmatched and not self.missing:
            return None
        said = []
        if self.unmatched:
            said.append(f"{self.unmatched} answers came back without the key of their request (a known Gemini "
                        f"Batch API fault, googleapis/python-genai#2008)")
        if self.missing:
            said.append(f"{self.missing} requests it ran have no result")
        return (f"{self.endpoint}: batch {self.info.id}: {' and '.join(said)}: they are paid and counted as spent; "
                f"{WHAT_TO_DO}")
