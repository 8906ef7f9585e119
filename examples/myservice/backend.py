"""In-memory stand-ins for the service's database, mailer, gateway and mailboxes, so that
``myservice.jobs`` runs as written; a real service puts its own clients here."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Card:
    """A SIM card row: its id (the initializer's checkpoint) and its ICCID (the poll item)."""

    id: int
    iccid: str


@dataclass
class Database:
    """A stand-in for a connection pool: orders, packages and cards, in memory."""

    orders: dict[int, dt.datetime] = field(default_factory=dict)  # order id -> expires at
    packages: list[int] = field(default_factory=lambda: [101, 102, 103])  # due to activate
    cards: list[Card] = field(
        default_factory=lambda: [Card(n, f"8986{n:015d}") for n in range(1, 2501)]
    )
    activated: list[int] = field(default_factory=list)
    resets: int = 0

    async def execute(self, sql: str) -> None:
        """Run ``sql`` (here: nothing to run)."""


@dataclass
class Mailer:
    """Sends receipts; remembers what it sent."""

    sent: list[int] = field(default_factory=list)

    async def send(self, order_id: int) -> None:
        self.sent.append(order_id)


async def create_db_pool() -> Database:
    return Database()


async def expire_orders(db: Database, before: dt.datetime | None) -> None:
    """Drop the orders expired ``before`` (``None``: now)."""
    before = before or dt.datetime.now(dt.UTC)
    for order, expires in list(db.orders.items()):
        if expires <= before:
            del db.orders[order]


async def due_packages(db: Database) -> list[int]:
    return list(db.packages)


async def activate_package(db: Database, package_id: int) -> None:
    db.activated.append(package_id)
    db.packages.remove(package_id)


async def reset_daily_usage(db: Database) -> None:
    db.resets += 1


async def gateway_query(card_id: str) -> dict[str, Any]:
    await asyncio.sleep(0)  # a real one asks the operator's gateway over the network
    return {"iccid": card_id, "online": True}


async def fetch_cards_after(
    db: Database, cursor: str | None, batch: int
) -> AsyncIterator[list[Card]]:
    """The cards after ``cursor`` (a card id), ``batch`` at a time, in id order."""
    rows = [card for card in db.cards if cursor is None or card.id > int(cursor)]
    for start in range(0, len(rows), batch):
        yield rows[start : start + batch]


def blocking_idle(seconds: float, mailbox: str = "inbox") -> None:
    """A blocking wait for new mail (IMAP IDLE, say); here a short sleep."""
    time.sleep(min(seconds, 0.5))


def list_mailboxes(ctx: object) -> list[str]:
    return ["support", "sales"]
