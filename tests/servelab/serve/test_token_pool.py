"""Simulated output tokens: whatever a request draws, its text re-encodes to the same ids."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from servelab.serve.simulated import NoRoundTripTokens, draw_token, round_trip_token_ids
from servelab.serve.tokenizer import ByteTokenizer, HFTokenizer
from tests.servelab.serve.helpers import HANG_S, start_server
from tests.servelab.serve.test_tokenizer import write_hf_tokenizer


def write_bpe_tokenizer(directory: Path) -> Path:
    """A byte-level BPE whose merges turn "xxxx" into one token, as real vocabularies do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    merges = [("x", "x"), ("xx", "xx"), ("Ġ", "h"), ("Ġh", "e"), ("l", "l"), ("Ġhe", "ll"),
              ("Ġhell", "o")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return directory


def write_trained_bpe(directory: Path) -> Path:
    """A byte-level BPE trained on this package's source: sub-word pieces that merge with
    their neighbours ("cre" + "qkv" re-encodes as "c" + "req" + "kv"), and runs of x."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    import servelab.serve.tokenizer as source

    texts = [Path(source.__file__).read_text()] * 3 + ["x" * 64] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1500, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return directory


def drawn(pool: tuple[int, ...], seed: int, count: int) -> list[int]:
    return [draw_token(pool, seed, index) for index in range(count)]


def assert_round_trips(tokenizer, pool: tuple[int, ...]) -> None:
    for seed in range(5):
        ids = drawn(pool, seed, 300)
        assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_byte_pool_is_printable_ascii_and_round_trips():
    tokenizer = ByteTokenizer()
    pool = round_trip_token_ids(tokenizer)
    assert len(pool) == 94  # "!" to "~": no specials, no lone UTF-8 lead bytes, no blank
    assert tokenizer.decode(list(pool)).isprintable()
    assert_round_trips(tokenizer, pool)


def test_bpe_pool_avoids_tokens_that_merge_when_repeated(tmp_path):
    tokenizer = HFTokenizer(write_bpe_tokenizer(tmp_path / "bpe"))
    x = tokenizer.encode("x", add_special_tokens=False)[0]
    # The old filler: 128 tokens of "x" read back as 32 by a client that re-encodes.
    assert len(tokenizer.encode(tokenizer.decode([x] * 128), add_special_tokens=False)) == 32
    pool = round_trip_token_ids(tokenizer)
    assert x not in pool and tokenizer.eos_token_id not in pool
    assert tokenizer.encode(" hello", add_special_tokens=False)[0] in pool
    assert_round_trips(tokenizer, pool)


def test_trained_bpe_pool_holds_whole_words_that_never_merge(tmp_path):
    tokenizer = HFTokenizer(write_trained_bpe(tmp_path / "trained"))
    assert len(tokenizer.encode("x" * 128, add_special_tokens=False)) == 2
    pool = round_trip_token_ids(tokenizer)
    assert len(pool) > 50
    assert all(tokenizer.decode([token]).strip().isalpha() for token in pool)
    assert_round_trips(tokenizer, pool)


def test_word_level_pool_holds_the_words(tmp_path):
    tokenizer = HFTokenizer(write_hf_tokenizer(tmp_path / "words", ["hello", "world", "x"]))
    pool = round_trip_token_ids(tokenizer)
    assert pool == (3, 4, 5)  # not <unk>, <s> or </s>
    assert_round_trips(tokenizer, pool)


def test_draws_depend_on_seed_and_index_only():
    pool = round_trip_token_ids(ByteTokenizer())
    assert drawn(pool, 7, 50) == drawn(pool, 7, 50)
    assert drawn(pool, 7, 50) != drawn(pool, 8, 50)
    assert len(set(drawn(pool, 7, 50))) > 10  # not one token over and over


def test_a_tokenizer_without_round_trip_tokens_is_refused(tmp_path):
    tokenizer = HFTokenizer(write_hf_tokenizer(tmp_path / "empty", []))
    with pytest.raises(NoRoundTripTokens, match="tokenizer empty"):
        round_trip_token_ids(tokenizer)


def test_tiny_model_limited_to_the_pool_answers_text_that_re_encodes(tiny_model):
    tokenizer = ByteTokenizer()
    pool = round_trip_token_ids(tokenizer)
    body = {"prompt": "Hello", "max_tokens": 24, "temperature": 1.0, "seed": 5,
            "return_token_ids": True}
    with start_server(tiny_model, allowed_token_ids=pool) as server:
        answer = httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                            timeout=HANG_S).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"  # the pool holds no EOS
    assert set(choice["token_ids"]) <= set(pool)
    assert tokenizer.encode(choice["text"]) == choice["token_ids"]
