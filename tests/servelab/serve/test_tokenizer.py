"""Tokenizers: byte-level round trips, streaming that never splits a character, HF loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.serve.server import assemble
from servelab.serve.state import ApiConfig
from servelab.serve.tokenizer import EOS_ID, ByteTokenizer, HFTokenizer, load_tokenizer
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig

TEXT = "héllo wörld € 😀 done"


def test_byte_tokenizer_round_trips_and_reserves_specials():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert min(ids) >= 3 and max(ids) < tok.vocab_size == 259
    assert tok.decode(ids) == TEXT
    assert tok.decode([1, EOS_ID, *ids, 0, 300]) == TEXT  # specials and ids past bytes: no text


@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_stream_decoder_emits_only_whole_characters(step):
    ids = ByteTokenizer().encode(TEXT)
    decoder = ByteTokenizer().decoder()
    pieces = [decoder.feed(ids[i:i + step]) for i in range(0, len(ids), step)]
    pieces.append(decoder.feed([], final=True))
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in piece for piece in pieces)


def test_stream_decoder_replaces_invalid_bytes_and_flushes_a_dangling_lead():
    decoder = ByteTokenizer().decoder()
    assert decoder.feed([0xE2 + 3]) == ""  # a 3-byte lead waits for its continuation
    assert decoder.feed([ord("!") + 3]) == "\ufffd!"  # which never came
    assert decoder.feed([0xF0 + 3]) == ""
    assert decoder.feed([], final=True) == "\ufffd"


def write_hf_tokenizer(directory: Path, words: list[str]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return directory


def test_hf_tokenizer_directory_loads_encodes_and_streams(tmp_path):
    directory = write_hf_tokenizer(tmp_path / "tok", ["hello", "world"])
    tok = load_tokenizer(directory)
    assert isinstance(tok, HFTokenizer)
    assert tok.vocab_size == 5 and tok.eos_token_id == 2
    ids = tok.encode("hello world")
    assert ids == [3, 4]
    decoder = tok.decoder()
    assert decoder.feed([3]) + decoder.feed([4], final=True) == "hello world"


def test_tokenizer_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="cannot load"):
        load_tokenizer(tmp_path)


def test_model_vocab_must_cover_the_tokenizer():
    scheduler = Scheduler(SchedulerConfig(num_blocks=8, max_model_len=64))
    with pytest.raises(ValueError, match="259 ids"):
        assemble(scheduler, ConstantBackend(), ByteTokenizer(), 100, ApiConfig("m", 64))
