"""A whole trace interned with each session's prompts sharing one id array.

Why: the tuner interns a trace once and replays windows of it for hundreds of trials
(``tuner.replay.intern_requests``). Split from the trace's 64-token hash blocks to 16-token
KV blocks, the agentic hour's 17,594 prompts are 53 M KV-block ids (430 MB), yet its
986 sessions repeat themselves: a turn's prompt is the previous turn's prompt, its output
and a tool result, so every turn's ids are a prefix of the session's longest prompt.
Ranking 13 M raw hashes (polars' dense rank) and writing 53 M ids cost ~3 s of the
tuner's ~4 s load; here a session's longest prompt (its *host*) is interned and split
once and every other prompt of the session whose source hashes equal the host's prefix
(checked element by element, not assumed from the chaining) is a view of the host's ids.
Prompts that are not such a prefix, and every output, get their own ids as before.

The ids name exactly the equal KV hashes, as whole-trace interning does (only their
values differ, and no decision of the twin depends on them): a contained prompt's source
hashes are the host's, position by position, so its ids are the host's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.trace.reblock_vec import source_chains

_NO_IDS = np.zeros(0, dtype=np.int64)


def shared_prompt_ids(values: np.ndarray, prompt_starts: np.ndarray, prompt_counts: np.ndarray,
                      output_starts: np.ndarray, output_counts: np.ndarray,
                      input_lens: np.ndarray, output_lens: np.ndarray, sessions: np.ndarray,
                      from_block_size: int, to_block_size: int, dense_ids: Any
                      ) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """KV-block ids of every row: ``(prompts, outputs, number of ids)``.

    ``values`` holds every row's raw source hashes (row ``i``'s prompt at
    ``prompt_starts[i]``, ``prompt_counts[i]`` of them; its output likewise);
    ``sessions`` an integer code a row (``-1``: no session, its prompt is its own host);
    ``dense_ids(values) -> (ids, n)`` the interning (``tuner.replay.dense_hash_ids``).
    Requires ``from_block_size % to_block_size == 0`` (a split; grouping re-blocks first).

    Raises:
        ConfigError: as ``reblock_request_hashes``, for a row with too few hashes.
    """
    f, t = from_block_size, to_block_size
    k = f // t
    chains = source_chains(values, prompt_starts, prompt_counts, output_starts, output_counts,
                           input_lens, output_lens, f, t)
    n_prompt = np.asarray(input_lens, dtype=np.int64) // t
    prompt_sources = -(-n_prompt // k)
    host = _session_hosts(np.asarray(sessions, dtype=np.int64), n_prompt)
    contained = _prefix_of_host(values, chains, prompt_sources, host)
    own = ~contained
    # Sources that get ids: the prompts that are not contained (hosts among them) and the
    # output parts (from the block the prompt's last KV block lies in, to the chain's end).
    out_first = n_prompt // k
    out_sources = np.where(chains.n_target > n_prompt, chains.n_sources - out_first, 0)
    prompt_take = np.where(own, prompt_sources, 0)
    starts = np.concatenate([np.zeros(len(n_prompt), np.int64), out_first])
    counts = np.concatenate([prompt_take, out_sources])
    rows = np.concatenate([np.arange(len(n_prompt))] * 2)
    picked = values[chains.positions(rows, starts, counts)]
    ids, num_ids = dense_ids(picked)
    del picked
    whole = ids if k == 1 else (ids[:, None] * k + np.arange(k, dtype=np.int64)).ravel()
    whole.flags.writeable = False  # shared by a session's requests: no one may write
    at = (np.cumsum(counts) - counts) * k
    at_prompt, at_output = at[:len(n_prompt)].tolist(), at[len(n_prompt):].tolist()
    n_prompt_l, n_target_l = n_prompt.tolist(), chains.n_target.tolist()
    first_l, own_l, host_l = (out_first * k).tolist(), own.tolist(), host.tolist()
    prompts: list[np.ndarray] = [_NO_IDS] * len(n_prompt)
    outputs: list[np.ndarray] = []
    for i in range(len(n_prompt)):
        if own_l[i]:
            prompts[i] = whole[at_prompt[i]:at_prompt[i] + n_prompt_l[i]]
        a = at_output[i] - first_l[i]  # where sub-block 0 of the chain would be
        outputs.append(whole[a + n_prompt_l[i]:a + n_target_l[i]]
                       if n_target_l[i] > n_prompt_l[i] else _NO_IDS)
    for i in range(len(n_prompt)):
        if not own_l[i]:
            prompts[i] = prompts[host_l[i]][:n_prompt_l[i]]
    return prompts, outputs, num_ids * k


def _session_hosts(sessions: np.ndarray, n_prompt: np.ndarray) -> np.ndarray:
    """Each row's host: the first row of its session with the longest prompt in KV
    blocks (so a contained prompt is never longer than its host's; a row without a
    session hosts itself)."""
    n = len(sessions)
    host = np.arange(n, dtype=np.int64)
    keyed = np.flatnonzero(sessions >= 0)
    if not len(keyed):
        return host
    order = keyed[np.lexsort((keyed, -n_prompt[keyed], sessions[keyed]))]
    codes = sessions[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = codes[1:] != codes[:-1]
    group = np.cumsum(first) - 1
    host[order] = order[first][group]
    return host


def _prefix_of_host(values: np.ndarray, chains: Any, prompt_sources: np.ndarray,
                    host: np.ndarray) -> np.ndarray:
    """Whether each row's prompt sources equal its host's first ones (a host: False).

    One contiguous comparison a row (a chain is the prompt's hashes, then the output's):
    rows hold hundreds of sources each, so slices beat ragged index arrays by ~10x."""
    contained = np.zeros(len(host), dtype=bool)
    rows = np.flatnonzero(host != np.arange(len(host)))
    p_start, o_start = chains.prompt_starts.tolist(), chains.output_starts.tolist()
    cp, m = chains.chain_prompt.tolist(), prompt_sources.tolist()
    for r, h in zip(rows.tolist(), host[rows].tolist()):
        contained[r] = _equal_prefix(values, m[r], (p_start[r], cp[r], o_start[r]),
                                     (p_start[h], cp[h], o_start[h]))
    return contained


def _equal_prefix(values: np.ndarray, n: int, a: tuple[int, int, int],
                  b: tuple[int, int, int]) -> bool:
    """Whether the first ``n`` chain elements of two rows are equal; a row is
    ``(prompt start, chain elements from the prompt, output start)``."""
    done = 0
    while done < n:
        # the longest run from ``done`` on that is contiguous in both rows
        sa, ea = ((a[0] + done, a[1] - done) if done < a[1] else (a[2] + done - a[1], n))
        sb, eb = ((b[0] + done, b[1] - done) if done < b[1] else (b[2] + done - b[1], n))
        run = min(n - done, ea, eb)
        # Bytes compared, not ``np.array_equal`` (equal for integer hashes): a copy of the
        # two runs and one memcmp cost ~7 us against its ~25 us of checks and temporaries,
        # on the agentic hour's 16,608 rows (docs/performance.md, load32 round).
        if values[sa:sa + run].tobytes() != values[sb:sb + run].tobytes():
            return False
        done += run
    return True
