"""Who a bearer token belongs to, remembered for a short while: every API request, every
proxied request and every open session's recheck authenticates, and the store's answer
(`Store.token_user`) costs a read and a write.

A change to users, tokens or queues (which members belong to) that this process commits
forgets every user remembered before it, at once: the store counts such changes once
they have committed (`Store.accounts_changed`), and a user remembered at another count
than the store's now is not trusted. A lookup that was under way during a change is
remembered at the count before it, so it is not trusted either. Another server sharing a
PostgreSQL store sees a change to users or tokens at most TOKEN_CACHE_SECONDS late.
"""

from __future__ import annotations

import time
import weakref

from starlette.concurrency import run_in_threadpool

from corral.store import Store, UserRecord
from corral.store.accounts import digest

# How long an authenticated token is trusted without asking the database again; the
# token's last use in the store is exact to this too.
TOKEN_CACHE_SECONDS = 10.0


class TokenCache:
    """The users of the tokens `store` answered for lately."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Token digest -> (user, when it was looked up, when the token expires, the
        # store's count of account changes before it was looked up).
        self._users: dict[str, tuple[UserRecord, float, float | None, int]] = {}
        # The count the remembered users were looked up at, mostly (see `authenticate`).
        self._counted = store.accounts_changed

    def remembered(self, token: str) -> UserRecord | None:
        """The token's user if `authenticate` found it a short while ago, with no change
        to accounts since, and it has not expired since; no database."""
        known = self._users.get(digest(token))
        if known is None:
            return None
        user, looked_up, expires_at, counted = known
        if counted != self.store.accounts_changed:
            return None
        if time.monotonic() - looked_up >= TOKEN_CACHE_SECONDS:
            return None
        if expires_at is not None and expires_at <= time.time():
            return None
        return user

    def authenticate(self, token: str) -> UserRecord | None:
        """The token's user, or None (also for a revoked or expired token): remembered,
        or else the store's answer, which is remembered. It may read the database: call
        it in a worker thread."""
        known = self.remembered(token)
        if known is not None:
            return known
        counted = self.store.accounts_changed
        found = self.store.token_user(token)
        if found is None:
            return None
        if counted != self._counted:
            # Those remembered before a change are of no use any more.
            self._users.clear()
            self._counted = counted
        self._users[digest(token)] = (found[0], time.monotonic(), found[1], counted)
        return found[0]

    async def user(self, token: str) -> UserRecord | None:
        """`authenticate` from the event loop: a token remembered costs no trip to a
        worker thread; the database is read in one only when it is not."""
        found = self.remembered(token)
        if found is None:
            found = await run_in_threadpool(self.authenticate, token)
        return found


# Each store's cache, for as long as the store lives.
_caches: weakref.WeakKeyDictionary[Store, TokenCache] = weakref.WeakKeyDictionary()


def of(store: Store) -> TokenCache:
    """The token cache of `store` (made on first use)."""
    cache = _caches.get(store)
    if cache is None:
        cache = _caches.setdefault(store, TokenCache(store))
    return cache
