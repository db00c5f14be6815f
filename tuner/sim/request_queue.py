"""Waiting queues: ``vllm/v1/core/sched/request_queue.py`` @ 0.33.0.

``FCFSRequestQueue`` is a deque (append on arrival, pop from the front, preempted
requests go back to the front). ``PriorityRequestQueue`` is a binary heap ordered like
``Request.__lt__``: (priority, arrival time, request id); "prepend" on a heap is a push.
``create_request_queue(policy)`` picks one.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator

from tuner.sim.request import SimRequest


class FCFSRequestQueue(deque):
    """First come, first served; the scheduler reads the head with ``[0]``."""

    def add_request(self, request: SimRequest) -> None:
        self.append(request)

    def pop_request(self) -> SimRequest:
        return self.popleft()

    def peek_request(self) -> SimRequest:
        return self[0]

    def prepend_request(self, request: SimRequest) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: list[SimRequest]) -> None:
        """Put ``requests`` at the front, keeping their order."""
        self.extendleft(reversed(requests))

    def remove_requests(self, requests: list[SimRequest]) -> None:
        drop = {id(r) for r in requests}
        kept = [r for r in self if id(r) not in drop]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue:
    """Heap by (priority, arrival_s, request_id): lower priority value first."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, SimRequest]] = []

    def add_request(self, request: SimRequest) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_s,
                                    request.request_id, request))

    prepend_request = add_request

    def prepend_requests(self, requests: list[SimRequest]) -> None:
        """No front in a heap: each request goes back by its key (as vLLM's)."""
        for request in requests:
            self.add_request(request)

    def remove_requests(self, requests: list[SimRequest]) -> None:
        drop = {id(r) for r in requests}
        self._heap = [item for item in self._heap if id(item[3]) not in drop]
        heapq.heapify(self._heap)

    def pop_request(self) -> SimRequest:
        return heapq.heappop(self._heap)[3]

    def peek_request(self) -> SimRequest:
        return self._heap[0][3]

    def __getitem__(self, index: int) -> SimRequest:
        if index != 0:
            raise IndexError("a priority queue only exposes its head")
        return self._heap[0][3]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[SimRequest]:
        """Requests in pop order (a sorted copy; O(n log n))."""
        return (item[3] for item in sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; use 'fcfs' or 'priority'")
