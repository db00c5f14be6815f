"""The study's trace, loaded once and small, for a report's replays and trace charts.

Why: a report replays the baseline and the tuned settings on the training and held-out
windows and charts the trace. Done with plain request records, the README's profile (the
bundled agentic hour: 17,594 prompts of 48.5k tokens on average, 13 M 64-token block
hashes, 53 M at the 16-token KV block size) took 148 s and 5.96 GB: the hashes as Python
ints in tuples, re-blocked to 16 tokens as four times as many, plus the trace read again
for its charts.

Here the trace is read once into flat arrays, hashes are interned to dense ids at the
trace's own block size (``int64``, 8 bytes per 64-token block), and each request's KV
block ids are derived from them only when the twin admits it (:class:`LazyKvIds`, the
same arithmetic as :func:`tuner.trace.reblock_vec.reblock_ids`, so replays are identical to
the tuner's own). The trace charts' columns (arrival, lengths, ideal prefix hit) are
computed from the same ids, so no second pass over the hashes is needed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.report.trace_report import TraceColumns, _flat, ideal_hits


class LazyKvIds:
    """One request's prompt or output KV block ids, computed when the twin asks.

    The twin copies a request's hashes into its own list when the request arrives
    (``tolist()``) and drops them when it finishes, so only live requests hold KV-sized
    id lists; this object holds a view into the trace-sized ids.
    """

    __slots__ = ("_prompt", "_output", "_input_len", "_output_len", "_f", "_t", "_which")

    def __init__(self, prompt: np.ndarray, output: np.ndarray, input_len: int,
                 output_len: int, from_block_size: int, to_block_size: int,
                 which: int) -> None:
        self._prompt, self._output = prompt, output
        self._input_len, self._output_len = input_len, output_len
        self._f, self._t, self._which = from_block_size, to_block_size, which

    def array(self) -> np.ndarray:
        from tuner.trace.reblock_vec import reblock_ids

        return reblock_ids(self._prompt, self._output, self._input_len, self._output_len,
                           self._f, self._t)[self._which]

    def tolist(self) -> list[int]:
        return self.array().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """``np.asarray(ids)``: the fleet's prefix-aware router reads a request's blocks
        as an array (``tuner.sim.fleet.router``), as it does the replay's own id arrays."""
        ids = self.array()
        return ids if dtype is None else ids.astype(dtype, copy=False)

    def __len__(self) -> int:
        return len(self.array())

    def __iter__(self) -> Any:
        return iter(self.tolist())


@dataclass(slots=True)
class CompactTrace:
    """What a report needs from a trace, held as arrays."""

    requests: Any  # InternedRequests at the KV block size (hashes derived lazily)
    columns: TraceColumns  # for the trace charts
    fingerprint: str  # tuner.tune.evaluate.requests_fingerprint of the records
    hash_block_size: int  # the trace's
    kv_block_size: int


def load_compact(trace: Any, kv_block_size: int) -> CompactTrace:
    """Read ``trace`` (a ``Trace``) once: fingerprint, interned requests, chart columns.

    Order matters for the peak: the frame is dropped as soon as its hash columns are flat
    ``uint64`` arrays, those are dropped once interned, and the per-request objects hold
    views into the ids only.
    """
    from tuner.replay import InternedRequests, dense_hash_ids, intern_requests
    from tuner.trace import TraceRequest
    from tuner.tune.evaluate import requests_fingerprint

    f, t = int(trace.metadata.hash_block_size), int(kv_block_size)
    df = trace.lazy().collect()  # arrival order, as the replays and the fingerprint need
    n = df.height
    cols = {name: df.get_column(name).to_list() for name in (
        "request_id", "arrival_s", "input_len", "output_len", "session_id", "parent_id", "turn",
        "priority", "cache_salt", "model", "status")}
    pv, po = _flat(df.get_column("block_hashes").to_arrow())
    ov, oo = _flat(df.get_column("output_block_hashes").to_arrow())
    del df

    def record(i: int, prompt: Any, output: Any) -> Any:
        return TraceRequest(
            request_id=cols["request_id"][i], arrival_s=cols["arrival_s"][i],
            input_len=cols["input_len"][i], output_len=cols["output_len"][i],
            block_hashes=prompt, output_block_hashes=output,
            session_id=cols["session_id"][i], parent_id=cols["parent_id"][i],
            turn=cols["turn"][i], priority=cols["priority"][i] or 0,
            cache_salt=cols["cache_salt"][i], model=cols["model"][i], status=cols["status"][i])

    fingerprint = requests_fingerprint(
        [record(i, pv[po[i]:po[i + 1]], ov[oo[i]:oo[i + 1]]) for i in range(n)], f)
    # One id per distinct hash as it stands in the trace (partial last blocks included:
    # a 16-token KV block inside a partly filled 64-token block takes its id from it).
    ids, num_ids = dense_hash_ids(np.concatenate([pv, ov]))
    n_prompt_hashes = len(pv)
    del pv, ov
    pid, oid = ids[:n_prompt_hashes], ids[n_prompt_hashes:]
    inp = np.asarray(cols["input_len"], dtype=np.int64)
    columns = TraceColumns(np.asarray(cols["arrival_s"], dtype=np.float64), inp,
                           np.asarray(cols["output_len"], dtype=np.int64),
                           ideal_hits(pid, po, oid, oo, inp, f, num_ids=num_ids), f)
    requests = InternedRequests()
    split = f > t and f % t == 0
    for i in range(n):
        prompt, output = pid[po[i]:po[i + 1]], oid[oo[i]:oo[i + 1]]
        if split:
            args = (prompt, output, int(inp[i]), int(cols["output_len"][i]), f, t)
            requests.append(record(i, LazyKvIds(*args, 0), LazyKvIds(*args, 1)))
        else:
            requests.append(record(i, prompt, output))
    if split:
        requests.num_hash_ids, requests.block_size = num_ids * (f // t), t
    else:
        # KV blocks as large as the trace's or larger (grouping): the eager path tune uses.
        requests = intern_requests(requests, t, hash_block_size=f)
    return CompactTrace(requests, columns, fingerprint, f, t)
