"""Stand-in only (no upstream module): the ranks of a test are controllers in
one process, and this replaces the ``torch.distributed`` process groups
(gloo) that ``managers/cache_controller.py`` @
001067fffe33427bee0ed2f007fb7551a1d76b44 uses.

Facts relied on (that file):

* ``_create_sync_groups()`` makes, per purpose (one set for prefetch hits,
  one for prefetch completion), a new gloo group for each base group of more
  than one rank: [attn_cp_group, attn_tp_group] when either is set, else
  [tp_group]; plus pp_group; a rank set already seen is skipped. Group
  creation is collective, so every rank creates them in the same order.
* ``_all_reduce(tensor, op, groups)`` all-reduces in place over each group in
  turn; the controller only uses ``ReduceOp.MIN``, on int tensors (a scalar
  token count, or a vector of pool hits).

Here a group is ``InProcessGroup(world_size)``; each rank holds a
``GroupHandle`` (``group.handle(rank)``) with ``rank``, ``world_size``,
``all_reduce(tensor, ReduceOp.MIN)`` (blocks until every rank of the group
has made its n-th call, then all get the element-wise minimum) and
``derive()`` (the k-th call on every rank returns the same new group: the
collective creation of a sub-group). A call that waits longer than the
group's ``timeout_s`` raises TimeoutError; ``abort()`` wakes every waiter with
an error (for test teardown).
"""

import threading
from enum import Enum
from typing import Dict

import torch


class ReduceOp(Enum):
    MIN = "min"


class InProcessGroup:
    def __init__(self, world_size: int, timeout_s: float = 30.0, name: str = "group"):
        self.world_size, self.timeout_s, self.name = world_size, timeout_s, name
        self._cond = threading.Condition()
        self._pending: Dict[int, Dict[int, torch.Tensor]] = {}
        self._results: Dict[int, list] = {}
        self._children: Dict[int, "InProcessGroup"] = {}
        self._aborted = False

    def handle(self, rank: int) -> "GroupHandle":
        assert 0 <= rank < self.world_size
        return GroupHandle(self, rank)

    def handles(self):
        return [self.handle(r) for r in range(self.world_size)]

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            for child in self._children.values():
                child.abort()
            self._cond.notify_all()

    def _child(self, k: int) -> "InProcessGroup":
        with self._cond:
            if k not in self._children:
                self._children[k] = InProcessGroup(self.world_size, self.timeout_s, f"{self.name}/{k}")
                if self._aborted:
                    self._children[k]._aborted = True
            return self._children[k]

    def _reduce(self, seq: int, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        with self._cond:
            if self._aborted:
                raise RuntimeError(f"{self.name}: aborted")
            self._pending.setdefault(seq, {})[rank] = tensor.clone()
            if len(self._pending[seq]) == self.world_size:
                vals = list(self._pending.pop(seq).values())
                out = vals[0]
                for v in vals[1:]:
                    out = torch.minimum(out, v)
                self._results[seq] = [out, self.world_size]
                self._cond.notify_all()
            self._cond.wait_for(lambda: seq in self._results or self._aborted, timeout=self.timeout_s)
            if seq not in self._results:
                raise RuntimeError(f"{self.name}: aborted") if self._aborted else TimeoutError(
                    f"{self.name}: rank {rank} waited {self.timeout_s}s in all_reduce #{seq} "
                    f"for {self.world_size - len(self._pending.get(seq, {}))} more rank(s)")
            entry = self._results[seq]
            entry[1] -= 1
            if entry[1] == 0:
                del self._results[seq]
            return entry[0]


class GroupHandle:
    """One rank's view of an InProcessGroup (the process group object of a rank)."""

    def __init__(self, group: InProcessGroup, rank: int):
        self.group, self.rank = group, rank
        self._seq = 0
        self._derived = 0

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.MIN) -> None:
        assert op is ReduceOp.MIN, "the controller only reduces with MIN"
        seq, self._seq = self._seq, self._seq + 1
        tensor.copy_(self.group._reduce(seq, self.rank, tensor))

    def derive(self) -> "GroupHandle":
        k, self._derived = self._derived, self._derived + 1
        return self.group._child(k).handle(self.rank)
