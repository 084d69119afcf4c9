"""Client liveness: clients ping (every second by default); one silent for ``client_ttl`` seconds expires.

A client becomes *alive* when it mounts or remounts segments (``register``) and stays alive while it
pings. A ping from a client that is not alive (never registered, expired, or from before a master restart)
is answered NEED_REMOUNT: the client must call ReMountSegment (with its segments, possibly none), which
registers it again. On expiry the master unmounts all the client's segments (dropping the replicas on them)
and revokes its puts in progress.

Threading: not thread-safe; the master calls everything under its lock.
"""

from __future__ import annotations


class ClientRegistry:
    def __init__(self, ttl_sec: float) -> None:
        if ttl_sec <= 0:
            raise ValueError(f"client_ttl must be positive, got {ttl_sec}")
        self.ttl = ttl_sec
        self._deadline: dict[str, float] = {}  # alive client -> expiry time

    def register(self, client_id: str, now: float) -> None:
        self._deadline[client_id] = now + self.ttl

    def ping(self, client_id: str, now: float) -> bool:
        """Refreshes an alive client; False (NEED_REMOUNT) for a client that is not alive."""
        if client_id not in self._deadline:
            return False
        self._deadline[client_id] = now + self.ttl
        return True

    def is_alive(self, client_id: str) -> bool:
        return client_id in self._deadline

    def forget(self, client_id: str) -> None:
        self._deadline.pop(client_id, None)

    def expire(self, now: float) -> list[str]:
        """Removes and returns the clients whose TTL ran out."""
        dead = [c for c, d in self._deadline.items() if d <= now]
        for c in dead:
            del self._deadline[c]
        return dead

    def alive(self) -> list[str]:
        return list(self._deadline)

    def __len__(self) -> int:
        return len(self._deadline)
