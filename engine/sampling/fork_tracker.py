"""Forks waiting for their parent's prefill: the other choices of an n>1 request.

The first choice of an n>1 request (the parent) is queued; its siblings (children, same prompt)
wait here until the parent's prompt is computed, then start on its blocks (copy-on-write) and
compute only the last prompt token themselves. If the parent ends before that (abort, error,
deadline) the children are released to queue on their own. A child finished while it waits
(aborted) is simply dropped from its parent's list.

The scheduler owns one `PendingForks` and decides what a start or release means for the queue
and the KV cache; this class only keeps the parent <-> children bookkeeping consistent. Plain
Python, no torch.
"""

from __future__ import annotations

from weir.engine.request import Request


class PendingForks:
    """Parent id -> children awaiting its prefill, and child id -> parent id, kept in step."""

    def __init__(self) -> None:
        self._children: dict[str, list[Request]] = {}
        self._parent: dict[str, str] = {}

    def add(self, parent: Request, children: list[Request]) -> None:
        """`children` (the parent's prompt) wait for `parent`'s prefill. Raises ValueError if a
        child's prompt differs; nothing is recorded then."""
        for child in children:
            if child.prompt_token_ids != parent.prompt_token_ids:
                raise ValueError("a fork must have its parent's prompt")
        if not children:
            return
        for child in children:
            self._parent[child.request_id] = parent.request_id
        self._children.setdefault(parent.request_id, []).extend(children)

    def __bool__(self) -> bool:
        return bool(self._children)

    def __len__(self) -> int:
        """Children waiting, over all parents."""
        return len(self._parent)

    def is_parent(self, request_id: str) -> bool:
        return request_id in self._children

    def is_waiting_child(self, request_id: str) -> bool:
        return request_id in self._parent

    def num_children(self, request_id: str) -> int:
        """Children waiting on `request_id` (0 when it is no parent)."""
        return len(self._children.get(request_id, ()))

    def take_children(self, parent_id: str) -> list[Request]:
        """Remove and return the children waiting on `parent_id` (to start or to release them)."""
        children = self._children.pop(parent_id, [])
        for child in children:
            del self._parent[child.request_id]
        return children

    def drop_child(self, child: Request) -> bool:
        """Forget a waiting child (it finished while it waited); False if it was not waiting."""
        parent_id = self._parent.pop(child.request_id, None)
        if parent_id is None:
            return False
        siblings = self._children[parent_id]
        siblings.remove(child)
        if not siblings:
            del self._children[parent_id]
        return True
