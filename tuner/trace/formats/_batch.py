"""What a format reader gets and gives back: :class:`IngestContext` (hashing, block size,
bad-record handling) in, :func:`make_batch` tables out.

Readers (one module per format in this package) import only this module and the trace
helpers they need; the ingest driver (:mod:`tuner.trace._ingest`) imports the readers.
The two used to import each other (the driver lazily), an import circle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa

from tuner.errors import TraceFormatError
from tuner.outputs import AtomicOutput
from tuner.trace.hashing import Hasher
from tuner.trace.schema import MAX_SPAN_S, MAX_TOKENS, SCHEMA  # noqa: F401 - re-exported
from tuner.trace.sources import json_problem

OnError = Literal["fail", "skip"]

#: Internal batch column: 1-based source line of each row (dropped before writing).
LINE = "_line"


#: The range every other integer field (ids, turns) must fit: Arrow's int64. A JSON or
#: CSV number is unbounded; one past this used to end in an ``OverflowError`` traceback.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Token ids (vllm-log) are hashed as uint32, vLLM's own token id width.
MAX_TOKEN_ID = 2**32 - 1

#: What readers produce: the trace schema with 64-bit lengths, so an absurd length reaches
#: validation (and its message) as the number the log holds, not clipped or overflowed;
#: :class:`TraceWriter` casts the validated rows to :data:`SCHEMA`'s int32.
READER_SCHEMA = pa.schema([
    pa.field(f.name, pa.int64()) if f.name in ("input_len", "output_len") else f
    for f in SCHEMA.remove_metadata()])


class IngestContext:
    """Per-source state a reader needs: hashing, block size, and bad-record handling."""

    def __init__(self, *, path: str, hasher: Hasher, hash_block_size: int, on_error: OnError,
                 quarantine: "Quarantine", tokenizer: str | None = None,
                 source_index: int = 0, output_len: int | None = None) -> None:
        self.path = path
        self.hasher = hasher
        self.hash_block_size = hash_block_size
        self.on_error = on_error
        self.quarantine = quarantine
        self.tokenizer = tokenizer
        self.source_index = source_index
        self.stem = Path(path).name.split(".")[0] or "src"
        self.tokenizer_identity: str | None = None
        self.skipped = 0
        self.output_len = output_len  # --output-len: the length of every unlogged output
        self.filled: dict[str, int] = {}  # fill rule -> requests it filled

    def bad(self, line: int | None, field_name: str, reason: str, raw: bytes | str | None = None) -> None:
        """Report a malformed record: raise under ``fail``, quarantine under ``skip``."""
        if self.on_error == "fail":
            raise TraceFormatError(f"{field_name}: {reason}", path=self.path, line=line,
                                   field=field_name)
        self.skipped += 1
        self.quarantine.add(self.path, line, f"{field_name}: {reason}", raw)

    def token_count(self, line: int, field_name: str, value: Any, raw: bytes | str | None = None,
                    *, minimum: int = 0) -> int | None:
        """``value`` as a token count in ``[minimum, MAX_TOKENS]``, or None once reported.

        Every reader calls this *before* it allocates anything per token or per block (a
        prompt length of 10**29 used to have its block hashes generated first: minutes of
        CPU and gigabytes of memory before validation saw it). Accepts an integer, or an
        integral float / numeric string the way CSV logs write counts (``"12.0"``).
        """
        n = _integral(value)
        if n is None:
            self.bad(line, field_name, f"not an integer ({short_value(value)})", raw)
            return None
        if n < minimum:
            self.bad(line, field_name, f"{n} tokens; a prompt has at least 1" if minimum == 1
                     else f"{n} tokens is negative", raw)
            return None
        if n > MAX_TOKENS:
            self.bad(line, field_name, f"{_big(n)} tokens is absurd (limit {MAX_TOKENS:,})", raw)
            return None
        return n

    def bounded_int(self, line: int, field_name: str, value: Any, raw: bytes | str | None,
                    lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
        """``value`` as an integer in ``[lo, hi]`` (ids, priorities, turns), or None once
        reported; the bound comes before any conversion to a fixed-width column."""
        n = _integral(value)
        if n is None:
            self.bad(line, field_name, f"not an integer ({short_value(value)})", raw)
            return None
        if not lo <= n <= hi:
            self.bad(line, field_name, f"{_big(n)} is out of range [{lo:,}, {hi:,}]", raw)
            return None
        return n

    def json_object(self, raw: bytes, line: int) -> dict[str, Any] | None:
        """``raw`` parsed as one JSON object, or None once reported through :meth:`bad`.

        Every JSONL reader refuses the same two things in the same words: a line that is
        not JSON (or not UTF-8) and JSON that is not an object.
        """
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            self.bad(line, "json", json_problem(exc), raw)
            return None
        if not isinstance(obj, dict):
            self.bad(line, "json", "not a JSON object", raw)
            return None
        return obj

    def fill_output_len(self, line: int, max_tokens: int | None) -> int | None:
        """The output length of a request whose log holds no output, by the documented
        rule (docs/trace-format.md): ``--output-len`` if given, else the request's logged
        ``max_tokens`` (an upper bound: vLLM stops earlier at EOS or a stop string).
        Without either the record is bad (None: skipped or raised)."""
        if self.output_len is not None:
            rule, value = f"--output-len {self.output_len}", self.output_len
        elif max_tokens is not None:
            checked = self.token_count(line, "max_tokens", max_tokens)
            if checked is None:
                return None
            rule, value = "max_tokens from the logged SamplingParams (an upper bound)", checked
        else:
            self.bad(line, "output_token_ids", "no output logged and no max_tokens in its "
                     "SamplingParams; pass --output-len N or run vLLM with --enable-log-outputs")
            return None
        self.filled[rule] = self.filled.get(rule, 0) + 1
        return value


def epoch_seconds(value: float) -> float:
    """A Unix time in seconds from seconds, milliseconds, microseconds or nanoseconds.

    Which unit is told by magnitude, as Mooncake-style exporters write any of them: a time
    after 5138 AD in seconds (1e11) is taken as milliseconds, after 1e14 as microseconds,
    after 1e17 as nanoseconds. Times before 1e11 stay seconds (a relative clock starts at
    0). A value past 1e20 fits no unit and stays as it is, for the span check to refuse.
    """
    a = abs(value)
    if a >= 1e20 or a < 1e11:
        return value
    if a < 1e14:
        return value / 1e3
    if a < 1e17:
        return value / 1e6
    return value / 1e9


def relative_clock_seconds(raw: np.ndarray, scale: float) -> np.ndarray:
    """Seconds from a format's nominal unit (``raw * scale``), except where that lands
    after 5138 AD (1e11 s): those values are Unix epochs in a finer unit than the format
    documents (ms, µs or ns), read by magnitude with :func:`epoch_seconds`. A relative
    clock in a finer unit (µs from 0) cannot be told apart this way; the span check
    (:data:`MAX_SPAN_S`) refuses the absurd ones."""
    seconds = raw.astype(np.float64) * scale
    wrong = np.abs(seconds) >= 1e11
    if wrong.any():
        seconds[wrong] = [epoch_seconds(float(v)) for v in raw[wrong]]
    return seconds


def _integral(value: Any) -> int | None:
    """An integer from an int, an integral finite float or a numeric string; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if "_" in text:  # Python's digit grouping (int("1_0") == 10), not a logged number
            return None
        try:
            return int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        return int(value)
    return None


def _big(n: int) -> str:
    """``n`` with thousands separators, or in scientific form when it is enormous.

    Rounded to three significant digits through :class:`decimal.Decimal` (exact for any
    integer; ``float()`` overflows past 1e308), so a CSV's ``1e29``, which parses to
    99,999,999,999,999,991,433,150,857,216, reads back as ``1e+29``."""
    if abs(n) < 10**18:
        return f"{n:,}"
    mantissa, exponent = f"{Decimal(n):.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent[0]}{int(exponent[1:]):02d}"


def short_value(value: Any) -> str:
    """A value for an error message, cut so a huge one cannot flood the terminal."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Quarantine:
    """Bad records under ``--on-error skip``: JSON lines beside the output.

    Each line is ``{"source", "line", "error", "raw"}``; ``raw`` is the offending input
    line, so the file may hold prompt text: it stays beside the output, never inside it.
    Written like every output (:mod:`tuner.outputs`): placed only when ingest succeeds.
    """

    def __init__(self, path: Path, inputs: Sequence[str] = ()) -> None:
        self.path = path
        self.inputs = list(inputs)
        self.count = 0
        self._out: AtomicOutput | None = None
        self._fh: IO[str] | None = None

    def add(self, source: str, line: int | None, error: str, raw: bytes | str | None) -> None:
        if self._fh is None:
            self._out = AtomicOutput(self.path, inputs=self.inputs)
            self._fh = open(self._out.tmp_path, "w", encoding="utf-8")  # noqa: SIM115
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        self._fh.write(json.dumps({"source": source, "line": line, "error": error,
                                   "raw": raw}) + "\n")
        self.count += 1

    def close(self) -> None:
        """Place the quarantine file (when any record was skipped)."""
        if self._fh is not None and self._out is not None:
            self._fh.close()
            self._fh = None
            self._out.commit()

    def abort(self) -> None:
        if self._fh is not None and self._out is not None:
            self._fh.close()
            self._fh = None
            self._out.abort()


def make_batch(columns: dict[str, Any], lines: Any, *, field_names: dict[str, str] | None = None) -> pa.Table:
    """A reader's batch: canonical columns (missing optional ones become nulls) + lines.

    ``arrival_s`` holds seconds on the source's own clock; the driver shifts it.
    """
    n = len(lines)
    arrays = []
    for f in READER_SCHEMA:
        if f.name in columns:
            v = columns[f.name]
            arrays.append(v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v, f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    table = pa.Table.from_arrays(arrays, schema=READER_SCHEMA)
    table = table.append_column(LINE, pa.array(lines, pa.int64()))
    if field_names:
        # Source field names ride in the schema metadata, so validation errors can say
        # ``input_length`` (mooncake) rather than ``input_len``.
        table = table.replace_schema_metadata({b"tuner.fields": json.dumps(field_names).encode()})
    return table
