"""Tokens: listed (never their values) and revoked. Admins see and revoke anyone's;
other users their own."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Response

from corral.api.deps import API, StoreDep, User
from corral.api.errors import ERRORS, Forbidden
from corral.api.routes import PrefixedRoute
from corral.api.schemas.accounts import TokenInfoOut
from corral.store import NotFound

router = APIRouter(prefix=API, responses=ERRORS, tags=["users"], route_class=PrefixedRoute)


@router.get("/tokens", response_model=list[TokenInfoOut])
def list_tokens(current: User, store: StoreDep, user: str | None = None) -> list[TokenInfoOut]:
    """Tokens with their names, expiry and last use; of `user`, or of everyone for an
    admin. A user who is not an admin sees their own only."""
    if current.role != "admin":
        if user not in (None, current.name):
            raise Forbidden(f"{current.name} may list their own tokens only")
        user = current.name
    now = time.time()
    return [
        TokenInfoOut(
            id=t.id,
            user=t.user,
            name=t.name,
            created_at=t.created_at,
            expires_at=t.expires_at,
            revoked_at=t.revoked_at,
            last_used_at=t.last_used_at,
            active=t.revoked_at is None and (t.expires_at is None or t.expires_at > now),
        )
        for t in store.list_tokens(user)
    ]


@router.delete("/tokens/{token_id}", status_code=204)
def revoke_token(
    # Ids are an INTEGER column, 32-bit on PostgreSQL: a larger number is refused here,
    # not by the driver (a 500).
    token_id: Annotated[int, Path(ge=1, le=2**31 - 1)],
    current: User,
    store: StoreDep,
) -> Response:
    """Revoke a token: it stops working at once (the server's token cache is cleared)."""
    owner = store.token_owner(token_id)
    if current.role != "admin" and owner != current.name:
        # Not 403: whether another user's token exists is not this user's business.
        raise NotFound(f"token {token_id} not found")
    store.revoke_token(token_id)
    return Response(status_code=204)
