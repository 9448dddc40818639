"""Grammar compilation for one tokenizer (llguidance; no torch).

``Grammar`` (engine/constraints.py) -> llguidance grammar text -> an ``LLMatcher`` in the
grammar's start state. That matcher is what the cache keeps, by ``Grammar.digest``; every request
takes a ``deep_copy`` of it (microseconds: the copies share the compiled grammar and the lexer's
lazily built automaton, so the second request of a grammar is as fast as the hundredth).

Per ``Tokenizer`` object there is one ``GrammarCompiler`` (``compiler_for``): the tokenizer's
``LLTokenizer`` (its vocabulary as byte strings and token trie, built once: ~20 ms for the demo
model's 2k tokens, 0.5-0.7 s for SmolLM2's 49k on a busy 2-core machine) and a bounded,
thread-safe LRU of compiled grammars. Grammars that fail to compile are cached too, so a client
repeating a bad schema costs one compile, not one per request.

JSON schemas compile with no free whitespace and ``json.dumps``' separators (``", "``,
``": "``): one spelling per value, so an output is as short as its content allows and a model
cannot pad it with whitespace until ``max_tokens`` (a schema's own ``x-guidance`` options win).
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from engine.constraints import Grammar
from engine.errors import GrammarRejected

if TYPE_CHECKING:
    from engine.text.tokenizer import Tokenizer

DEFAULT_CAPACITY = 256  # compiled grammars kept per tokenizer
_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Short errors: the verbose form appends the parser state and the whole grammar.
_LIMITS = LLParserLimits(verbose_errors=False)
_WHAT = {"json_schema": "JSON schema", "lark": "lark grammar", "regex": "regex"}


class CompiledGrammar:
    """A grammar compiled for one tokenizer: ``matcher()`` gives a request its own state."""

    __slots__ = ("_start", "digest", "kind", "seconds")

    def __init__(self, grammar: Grammar, start: LLMatcher, seconds: float) -> None:
        self.digest = grammar.digest
        self.kind = grammar.kind
        self.seconds = seconds  # compile time, first mask included
        self._start = start  # never advanced: the start state every request copies

    def matcher(self) -> LLMatcher:
        return self._start.deep_copy()


@dataclass(frozen=True)
class CompileStats:
    entries: int
    capacity: int
    hits: int  # compiles answered from the cache (rejections included)
    misses: int  # grammars compiled (rejected or not)
    rejected: int  # of the misses, grammars that failed to compile
    compile_seconds: float  # total time spent compiling
    last_compile_seconds: float


class GrammarCompiler:
    """Compiles grammars for one tokenizer; a bounded LRU by digest. Thread-safe: the gateway
    checks grammars on worker threads while the engine thread compiles at admission."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._tokenizer = tokenizer
        self._ll: LLTokenizer | None = None
        self.capacity = capacity
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar | str] = OrderedDict()  # str: rejection
        self._hits = self._misses = self._rejected = 0
        self._seconds = self._last = 0.0

    @property
    def ll_tokenizer(self) -> LLTokenizer:
        """The tokenizer as llguidance sees it (built on first use, once)."""
        with self._lock:
            if self._ll is None:
                tok = self._tokenizer
                eos = list(tok.eos_token_ids) or None
                self._ll = LLTokenizer(tok.backend.to_str(), eos_token=eos)
            return self._ll

    def compile(self, grammar: Grammar) -> CompiledGrammar:
        """The compiled grammar; raises ``GrammarRejected`` naming what is wrong with it."""
        found = self._lookup(grammar.digest)
        if found is None:
            found = self._compile(grammar)
        if isinstance(found, str):
            raise GrammarRejected(found)
        return found

    def is_cached(self, grammar: Grammar) -> bool:
        with self._lock:
            return grammar.digest in self._cache

    def stats(self) -> CompileStats:
        with self._lock:
            return CompileStats(
                len(self._cache), self.capacity, self._hits, self._misses, self._rejected,
                self._seconds, self._last,
            )  # fmt: skip

    def _lookup(self, digest: str) -> CompiledGrammar | str | None:
        with self._lock:
            found = self._cache.get(digest)
            if found is not None:
                self._cache.move_to_end(digest)
                self._hits += 1
            return found

    def _compile(self, grammar: Grammar) -> CompiledGrammar | str:
        """Compile outside the lock (llguidance drops the GIL while it builds); two threads
        compiling one grammar at once both succeed and one result is kept."""
        ll = self.ll_tokenizer
        start = time.perf_counter()
        result: CompiledGrammar | str
        try:
            matcher = LLMatcher(ll, grammar_text(grammar), log_level=0, limits=_LIMITS)
            if matcher.is_error():
                raise GrammarRejected(f"{_WHAT[grammar.kind]}: {_one_line(matcher.get_error())}")
            # The first mask builds the lexer's automaton for the start state (shared by every
            # copy): done here, so it is part of the compile, not of a request's first step.
            matcher.deep_copy().compute_bitmask()
            result = CompiledGrammar(grammar, matcher, time.perf_counter() - start)
        except GrammarRejected as exc:
            result = str(exc)
        except ValueError as exc:  # llguidance refusing its input outright
            result = f"{_WHAT[grammar.kind]}: {_one_line(str(exc))}"
        seconds = time.perf_counter() - start
        with self._lock:
            self._misses += 1
            self._rejected += isinstance(result, str)
            self._seconds += seconds
            self._last = seconds
            self._cache[grammar.digest] = result
            self._cache.move_to_end(grammar.digest)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return result


def grammar_text(grammar: Grammar) -> str:
    """llguidance's grammar text for ``grammar``; GrammarRejected for a schema that is not JSON."""
    if grammar.kind == "json_schema":
        try:
            schema = json.loads(grammar.source)
        except ValueError as exc:
            raise GrammarRejected(f"JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarRejected("JSON schema must be an object or a boolean")
        return LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_DEFAULTS)  # type: ignore[arg-type]
    if grammar.kind == "lark":
        return LLMatcher.grammar_from_lark(grammar.source)
    if grammar.kind == "regex":
        return LLMatcher.grammar_from_regex(grammar.source)
    raise GrammarRejected(f"unknown grammar kind {grammar.kind!r}")


_EXCERPT = re.compile(r"^\s*(\^+|\d+ \|.*)\s*$")  # llguidance's source excerpt lines
_MAX_MESSAGE = 500


def _one_line(message: str) -> str:
    """llguidance's message on one line, without the excerpt lines (caret, numbered source)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not _EXCERPT.fullmatch(ln)]
    text = " ".join(lines) or "grammar rejected"
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


_compilers: weakref.WeakKeyDictionary[Tokenizer, GrammarCompiler] = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compiler_for(tokenizer: Tokenizer) -> GrammarCompiler:
    """The one compiler of this tokenizer object (the engine's and the gateway's share it when
    they share the tokenizer; a worker and its gateway each have their own)."""
    with _compilers_lock:
        found = _compilers.get(tokenizer)
        if found is None:
            found = _compilers[tokenizer] = GrammarCompiler(tokenizer)
        return found


def check_grammar(grammar: Grammar, tokenizer: Tokenizer) -> None:
    """Raise ``GrammarRejected`` (a ValueError; HTTP 400) when ``grammar`` cannot be compiled or
    enforced for this tokenizer: invalid JSON, an unsupported JSON-schema keyword (``Unimplemented
    keys: ["not"]``), an unsatisfiable schema, a lark or regex syntax error. Compiles at most once
    per digest (cached); call it off the event loop, a cold compile may take milliseconds."""
    compiler_for(tokenizer).compile(grammar)
