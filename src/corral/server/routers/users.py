"""Users and their tokens (an admin's), and who the caller is."""

from __future__ import annotations

from fastapi import APIRouter

from corral.server.deps import API, Admin, StoreDep, User
from corral.server.errors import ERRORS
from corral.server.schemas import TokenOut, UserIn, UserOut

router = APIRouter(prefix=API, responses=ERRORS, tags=["users"])


@router.get("/users", response_model=list[UserOut])
def list_users(_: Admin, store: StoreDep) -> list[UserOut]:
    return [UserOut.of(u) for u in store.list_users()]


@router.post("/users", response_model=TokenOut, status_code=201)
def create_user(body: UserIn, _: Admin, store: StoreDep) -> TokenOut:
    record, token = store.create_user(body.name, body.role, body.project, body.account())
    return TokenOut(user=record.name, token=token)


@router.post("/users/{name}/tokens", response_model=TokenOut, status_code=201)
def create_token(name: str, _: Admin, store: StoreDep) -> TokenOut:
    return TokenOut(user=name, token=store.create_token(name))


@router.get("/whoami", response_model=UserOut)
def whoami(current: User) -> UserOut:
    return UserOut.of(current)
