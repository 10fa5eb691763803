"""Stand-in of ``vllm/v1/core/sched/request_queue.py`` (the FCFS queue only),
from the calls scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06 makes.

Facts relied on: ``add_request`` (append), ``prepend_request``,
``prepend_requests(queue)``, ``pop_request`` / ``peek_request`` (front),
``remove_requests``, ``len``/``bool``/iteration.
"""

from collections import deque


class FCFSRequestQueue(deque):
    def add_request(self, request) -> None:
        self.append(request)

    def pop_request(self):
        return self.popleft()

    def peek_request(self):
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]

    def prepend_request(self, request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests) -> None:
        self.extendleft(reversed(list(requests)))

    def remove_request(self, request) -> None:
        self.remove(request)

    def remove_requests(self, requests) -> None:
        drop = set(id(r) for r in requests)
        kept = [r for r in self if id(r) not in drop]
        self.clear()
        self.extend(kept)


def create_request_queue(policy=None) -> FCFSRequestQueue:
    return FCFSRequestQueue()
