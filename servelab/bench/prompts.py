"""The load client's prompts: token ids whose shared leading tokens really are shared.

A trace row's prefix segments (prefix_hash_ids, each covering its prefix_hash_tokens tokens,
or PREFIX_BLOCK_TOKENS each) become tokens drawn from the segment id alone, so two rows that
name the same segments send identical leading tokens, and a live server's prefix cache sees
the hits the simulator counts; the rest of the prompt is drawn per request.

In a conversation, the segment that stands for the previous turn's answer is replaced by the
tokens the server actually generated, so turn k's prompt is turn k-1's prompt, its real
output and the new question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from executor.prompts import stable_seed, synth_prompt_tokens
from workloads.trace import Trace


@dataclass(frozen=True)
class PromptPlan:
    """What one row's prompt is made of: its length, its segments and the key of its tail."""

    key: str  # seeds the tokens no segment covers
    prompt_len: int
    segment_ids: tuple[int, ...] = ()
    segment_tokens: tuple[int, ...] = ()  # tokens each segment covers
    # Mixed into every segment's tokens: runs with different salts share nothing, so one run
    # does not find another's prompts in the server's prefix cache. "": the ids alone.
    salt: str = ""


@dataclass
class Conversation:
    """One session's memory: the answers the server generated, by the id of the segment that
    stands for each in later turns, and the previous turn's question and answer."""

    answers: dict[int, list[int]] = field(default_factory=dict)
    last_question_id: int | None = None
    last_output_ids: list[int] = field(default_factory=list)
    # Whether an answer came without its token ids (a server that ignores return_token_ids):
    # the conversation cannot be carried on in tokens.
    ids_missing: bool = False


def prompt_plans(trace: Trace, seed: int, salt: str = "") -> list[PromptPlan]:
    """One plan per trace row, in order."""
    ids = trace.table["prefix_hash_ids"].tolist() if trace.has_prefix_hashes else None
    tokens = trace.prefix_tokens() if ids is not None else None
    plans = []
    for i, (rid, prompt_len) in enumerate(zip(trace.request_ids, trace.prompt_len.tolist(),
                                              strict=True)):
        key = f"{seed}:{salt}:{rid}" if salt else f"{seed}:{rid}"
        if ids is None:
            plans.append(PromptPlan(key, int(prompt_len), salt=salt))
        else:
            plans.append(PromptPlan(key, int(prompt_len), tuple(int(x) for x in ids[i]),
                                    tuple(int(x) for x in tokens[i]), salt))
    return plans


def prompt_tokens(plan: PromptPlan, vocab_size: int) -> list[int]:
    """The plan's token ids: each segment's from its id (salted) alone, cut to prompt_len,
    the rest drawn from the plan's key."""
    ids = [_salted(seg_id, plan.salt) for seg_id in plan.segment_ids]
    return synth_prompt_tokens(plan.key, plan.prompt_len, vocab_size, ids,
                               prefix_hash_tokens=plan.segment_tokens)


def conversation_prompt(plan: PromptPlan, planned_ids: list[int],
                        conversation: Conversation) -> list[int]:
    """A turn's prompt_tokens (`planned_ids`) with every segment that stands for an earlier
    answer of the session replaced by the tokens the server really generated."""
    answers = _bind_answer(conversation, plan)
    out: list[int] = []
    at = 0  # where the current segment starts in planned_ids
    for seg_id, count in zip(plan.segment_ids, plan.segment_tokens, strict=True):
        out += answers[seg_id] if seg_id in answers else planned_ids[at:at + count]
        at += count
    return out + planned_ids[at:]


def _salted(segment_id: int, salt: str) -> int:
    return stable_seed(f"{salt}/{segment_id}") if salt else segment_id


def remember_turn(conversation: Conversation, plan: PromptPlan, output_ids: list[int],
                  num_tokens: int) -> None:
    """After a turn's answer (`num_tokens` streamed, `output_ids` of them with ids): its
    question is the plan's last segment, and the next turn's segment right after that
    question will stand for `output_ids`."""
    conversation.last_question_id = plan.segment_ids[-1] if plan.segment_ids else None
    conversation.last_output_ids = list(output_ids)
    conversation.ids_missing |= len(output_ids) < num_tokens


def _bind_answer(conversation: Conversation, plan: PromptPlan) -> dict[int, list[int]]:
    """Name the previous answer by its segment in this turn (the one right after the previous
    question; absent when the turn starts afresh or truncation dropped it); every answer."""
    ids = plan.segment_ids
    question = conversation.last_question_id
    for i in range(len(ids) - 1):
        if question is not None and ids[i] == question:
            conversation.answers[ids[i + 1]] = conversation.last_output_ids
            break
    return conversation.answers


def first_shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two prompts share."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
