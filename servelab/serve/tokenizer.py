"""Tokenizers for the server: byte-level by default (offline), or a Hugging Face directory.

Streaming decodes incrementally: text is emitted only once whole characters are available,
so a UTF-8 character split across tokens never reaches the client as a replacement char.
Chat messages become a prompt through the directory's chat template, else the plain one.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Protocol

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = 3  # byte b is token b + 3
REPLACEMENT = "\ufffd"


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    name: str
    vocab_size: int  # ids the tokenizer can produce are in [0, vocab_size)
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens dropped."""
        ...

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids of {"role", "content"} messages, ready for the assistant's turn."""
        ...

    def decoder(self) -> StreamDecoder: ...


class StreamDecoder(Protocol):
    """Turns a request's output tokens into text, a few tokens at a time."""

    def feed(self, token_ids: list[int], final: bool = False) -> str: ...


class ByteTokenizer:
    """Token = UTF-8 byte + 3; 0, 1, 2 are pad, bos, eos; ids past the bytes decode to ''."""

    name = "byte"
    vocab_size = 256 + BYTE_OFFSET
    eos_token_id: int | None = EOS_ID

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:  # noqa: ARG002
        """The UTF-8 bytes of text, shifted; no BOS is added either way."""
        return [b + BYTE_OFFSET for b in text.encode("utf-8")]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The plain chat template's prompt, encoded."""
        return self.encode(plain_chat_prompt(messages))

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids (specials and ids above the byte range are dropped)."""
        return bytes(_bytes_of(token_ids)).decode("utf-8", errors="replace")

    def decoder(self) -> ByteStreamDecoder:
        return ByteStreamDecoder()


def _bytes_of(token_ids: list[int]) -> list[int]:
    return [t - BYTE_OFFSET for t in token_ids if BYTE_OFFSET <= t < 256 + BYTE_OFFSET]


class ByteStreamDecoder:
    """Incremental UTF-8: an incomplete character waits for its next bytes."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_ids: list[int], final: bool = False) -> str:
        """Text completed by these tokens; `final` flushes a dangling partial character."""
        return self._utf8.decode(bytes(_bytes_of(token_ids)), final=final)


class HFTokenizer:
    """A `tokenizers` tokenizer.json from a Hugging Face model directory."""

    def __init__(self, directory: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError:
            raise ValueError("--tokenizer needs the `tokenizers` package; pip install "
                             "tokenizers, or omit --tokenizer for the byte-level one") from None
        directory = Path(directory)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"tokenizer {directory}: no tokenizer.json in the directory")
        try:
            self._tok = RustTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception on a bad file
            raise ValueError(f"tokenizer {file}: cannot load ({exc})") from None
        self.name = directory.name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = _eos_id(directory, self._tok)
        self._chat = _chat_tokenizer(directory)  # None: the directory has no chat template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text, with the special tokens the tokenizer's post-processor adds
        (unless add_special_tokens is False)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's prompt (else the plain one); ValueError if the template refuses."""
        if self._chat is None:
            return self.encode(plain_chat_prompt(messages))
        from jinja2 import TemplateError

        try:
            text = self._chat.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        except TemplateError as exc:  # e.g. raise_exception("roles must alternate")
            raise ValueError(f"chat template of {self.name}: {exc}") from None
        # The template writes the special tokens (BOS) itself; encode as transformers does.
        return self._chat.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=True)

    def decoder(self) -> HFStreamDecoder:
        return HFStreamDecoder(self)


class HFStreamDecoder:
    """vLLM's incremental detokenization: decode a short window, emit only settled text."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are fully emitted
        self._read = 0  # tokens up to here are reflected in the emitted text

    def feed(self, token_ids: list[int], final: bool = False) -> str:
        """New text once it no longer ends in a partial character (all of it when final)."""
        self._ids.extend(token_ids)
        decode = self._tokenizer.decode
        done = decode(self._ids[self._prefix:self._read])
        text = decode(self._ids[self._prefix:])
        if len(text) <= len(done) or (text.endswith(REPLACEMENT) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done):]


def _eos_id(directory: Path, tok: object) -> int | None:
    """EOS from tokenizer_config.json's eos_token, else config.json's eos_token_id."""
    config = directory / "tokenizer_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and tok.token_to_id(eos) is not None:
            return tok.token_to_id(eos)
    model_config = directory / "config.json"
    if model_config.is_file():
        eos_id = json.loads(model_config.read_text()).get("eos_token_id")
        if isinstance(eos_id, list):
            eos_id = eos_id[0] if eos_id else None
        return eos_id if isinstance(eos_id, int) else None
    return None


def _chat_tokenizer(directory: Path) -> object | None:
    """transformers' tokenizer of a directory that ships a chat template, else None."""
    config = directory / "tokenizer_config.json"
    in_config = config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
    in_files = any((directory / f).is_file() for f in ("chat_template.jinja", "chat_template.json"))
    if not (in_config or in_files):
        return None
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ValueError(f"tokenizer {directory} has a chat template; rendering it needs the "
                         "`transformers` package (pip install transformers)") from None
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(directory))
    except (OSError, ValueError) as exc:
        raise ValueError(f"tokenizer {directory}: cannot load its chat template ({exc})") from None
    return tok if tok.chat_template else None


def plain_chat_prompt(messages: list[dict[str, str]]) -> str:
    """The plain template: "<|role|>\\ncontent\\n" per message, then "<|assistant|>\\n"."""
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return turns + "<|assistant|>\n"


class StopStrings:
    """Cuts streamed text at the first stop string, holding back what could begin one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._held = ""  # the tail that may be the start of a stop string: not yet emitted

    def feed(self, text: str, final: bool = False) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was hit); the stop and what follows go."""
        if not self._stops:
            return text, False
        text, self._held = self._held + text, ""
        hits = [at for at in (text.find(stop) for stop in self._stops) if at >= 0]
        if hits:
            return text[:min(hits)], True
        if not final:
            self._held = text[_partial_stop_start(text, self._stops):]
        return text[:len(text) - len(self._held)], False


def _partial_stop_start(text: str, stops: tuple[str, ...]) -> int:
    """Where the longest tail of text that is a proper prefix of a stop string starts."""
    start = len(text)
    for stop in stops:
        # The earliest candidate is the longest; candidates begin with stop[0].
        at = text.find(stop[0], max(0, len(text) - len(stop) + 1))
        while at != -1 and at < start:
            if stop.startswith(text[at:]):
                start = at
                break
            at = text.find(stop[0], at + 1)
    return start


def load_tokenizer(directory: str | Path | None = None) -> Tokenizer:
    """The byte-level tokenizer (None) or a Hugging Face tokenizer directory's."""
    return ByteTokenizer() if directory is None else HFTokenizer(directory)
