"""The ledger's counts in Redis, shared by every replica that points at the same server.

Each operation is one Lua script, which Redis runs atomically, and one round trip. Time is Redis's
clock (`TIME`), so replicas with skewed clocks still agree on windows and leases. Keys, under the
prefix (`mcp-backfill:` by default):

    <p>used:<payer>                    tokens charged over the payer's lifetime (the process's, and
                                       a payer's with a lifetime allowance)
    <p>used:<payer>:<window>:<number>  tokens charged in one window; expires after the next one
    <p>res:<payer>                     sorted set: reservation lease -> expiry (ms)
    <p>resamt:<payer>                  hash: reservation lease -> tokens
    <p>lapsed:<payer>                  hash: lapsed (and charged) reservation lease -> tokens
    <p>settled:<payer>                 sorted set: settled lease -> when it is forgotten (ms)
    <p>rate:<key>                      sorted set: admissions of the last minute
    <p>slots:<key>                     sorted set: slot holder -> expiry (ms)
    <p>released:<key>                  sorted set: holder that gave its slot back -> when it is
                                       forgotten (ms), a lease later
    <p>claim:<key>                     who claimed the key; expires when the claim does

The scripts build key names themselves, so they need one Redis server, not Redis Cluster; the URL
is its address (failover needs one that follows the primary: this client does not speak Sentinel).
Without persistence, a restarted Redis has lost every count and every claim.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from mcp_backfill.credentials import hide_url_credentials
from mcp_backfill.errors import StoreUnavailable
from mcp_backfill.options import BUDGET_WINDOWS
from mcp_backfill.sampling.store import (
    LAPSED_MEMORY_SECONDS,
    LEASE_SECONDS,
    RATE_WINDOW_SECONDS,
    Held,
    Limit,
    Rate,
    RateRefusal,
    Standing,
)

__all__ = ["RedisStore"]

# How long a settled lease is remembered, so that the settlement sent again (its reply lost, then
# retried by redis-py or, after an outage, by the store link) charges nothing: one entry per call
# and payer. As long as a lapsed lease is remembered: a late settlement counts on that memory too.
SETTLED_MEMORY_SECONDS = LAPSED_MEMORY_SECONDS

_NOW = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_LEDGER = (
    f"local LAPSED_MEMORY_MS = {round(LAPSED_MEMORY_SECONDS * 1000)}\n"
    + f"local SETTLED_MEMORY_MS = {round(SETTLED_MEMORY_SECONDS * 1000)}\n"
    + """
local function counter(p, payer, window, seconds, now_ms)
  if seconds == 0 then return p .. 'used:' .. payer end
  return p .. 'used:' .. payer .. ':' .. window .. ':' .. math.floor(now_ms / 1000 / seconds)
end
-- allowances: {window, seconds, ...}; each one's count grows: a lifetime allowance's for ever, a
-- window's until the next window is over. A payer with neither a lifetime allowance nor
-- `allowances.total` (the process: what the deployment spent) keeps no key for ever.
local function charge(p, payer, allowances, tokens, now_ms)
  if tokens <= 0 then return end
  local lifetime = allowances.total
  for _, allowance in ipairs(allowances) do
    if allowance[2] == 0 then lifetime = false end
  end
  if lifetime then redis.call('INCRBY', counter(p, payer, '', 0, now_ms), tokens) end
  for _, allowance in ipairs(allowances) do
    local key = counter(p, payer, allowance[1], allowance[2], now_ms)
    redis.call('INCRBY', key, tokens)
    if allowance[2] > 0 then redis.call('EXPIRE', key, 2 * allowance[2]) end
  end
end
-- One limit's arguments from ARGV[i]: payer, n, total (1: keep a lifetime count without a lifetime
-- allowance), and n times (window, seconds, tokens); and the index after them.
local function read_limit(i)
  local payer, n, allowances = ARGV[i], tonumber(ARGV[i + 1]), {}
  allowances.total = ARGV[i + 2] == '1'
  i = i + 3
  for a = 1, n do
    allowances[a] = {ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}
    i = i + 3
  end
  return payer, allowances, i
end
-- What calls in flight hold; a lease whose holder stopped renewing it lapses, and its whole
-- reservation is charged (the holder died before it could say what the call cost), in the window
-- it lapsed in however much later its payer is read. It is remembered a while, so that a late
-- settlement charges only what the call cost beyond it.
local function reserved(p, payer, allowances, now_ms)
  local zset, amounts, lapsed = p .. 'res:' .. payer, p .. 'resamt:' .. payer, p .. 'lapsed:' .. payer
  local gone = redis.call('ZRANGEBYSCORE', zset, '-inf', now_ms, 'WITHSCORES')
  for g = 1, #gone, 2 do
    local lease = gone[g]
    local amount = tonumber(redis.call('HGET', amounts, lease) or '0')
    charge(p, payer, allowances, amount, tonumber(gone[g + 1]))
    redis.call('HDEL', amounts, lease)
    redis.call('HSET', lapsed, lease, amount)
    redis.call('PEXPIRE', lapsed, LAPSED_MEMORY_MS)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', zset, '-inf', now_ms) end
  local sum = 0
  for _, value in ipairs(redis.call('HVALS', amounts)) do sum = sum + tonumber(value) end
  return sum
end
-- Whether `lease` is held already: then this script is one redis-py sent again because the first
-- run's reply was lost, and it answers as that run did (admitted, its own reservation not counted
-- in `reserved_by`) rather than be refused by it and leave it to lapse and be charged whole.
local function held_already(p, payers, lease, reserved_by)
  if #payers == 0 or not redis.call('ZSCORE', p .. 'res:' .. payers[1], lease) then return false end
  for i, payer in ipairs(payers) do
    reserved_by[i] = reserved_by[i] - tonumber(redis.call('HGET', p .. 'resamt:' .. payer, lease) or '0')
  end
  return true
end
-- Whether `lease` was settled already: its holder gave up waiting for this script's reply (and
-- refused its request) and released it, on another connection, and that release overtook it.
local function released_already(p, payers, lease, amount)
  return amount > 0 and #payers > 0 and redis.call('ZSCORE', p .. 'settled:' .. payers[1], lease)
end
-- Hold `amount` for `lease` on every payer's budget until `expiry_ms` (renewed while its holder
-- lives); not a lease released already.
local function hold(p, payers, lease, amount, expiry_ms)
  if amount <= 0 or #payers == 0 or released_already(p, payers, lease, amount) then return end
  for _, payer in ipairs(payers) do
    redis.call('ZADD', p .. 'res:' .. payer, expiry_ms, lease)
    redis.call('HSET', p .. 'resamt:' .. payer, lease, amount)
  end
end
"""
)

_STANDING = """
-- The limits from ARGV[i] on (see read_limit).
local function standing(p, i, now_ms)
  local payers, used, reserved_by, admitted = {}, {}, {}, true
  while i <= #ARGV do
    local payer, allowances
    payer, allowances, i = read_limit(i)
    local r = reserved(p, payer, allowances, now_ms)
    local counts = {}
    for a, allowance in ipairs(allowances) do
      local u = tonumber(redis.call('GET', counter(p, payer, allowance[1], allowance[2], now_ms)) or '0')
      counts[a] = u
      if u + r >= allowance[3] then admitted = false end
    end
    payers[#payers + 1] = payer
    used[#used + 1] = counts
    reserved_by[#reserved_by + 1] = r
  end
  return admitted, payers, used, reserved_by
end
"""

# ARGV: prefix, lease, amount, ttl_ms, then the limits (see read_limit).
RESERVE = (
    _NOW
    + _LEDGER
    + _STANDING
    + """
local p, lease, amount, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local admitted, payers, used, reserved_by = standing(p, 5, now_ms)
if amount > 0 and held_already(p, payers, lease, reserved_by) then
  admitted = true
elseif admitted then
  hold(p, payers, lease, amount, now_ms + ttl)
end
return {admitted and 1 or 0, now_ms, cjson.encode(used), cjson.encode(reserved_by)}
"""
)

# ARGV: prefix, member, window_ms, lease, amount, ttl_ms, count, then count times (key, per_minute),
# then the limits.
ADMIT = (
    _NOW
    + _LEDGER
    + _STANDING
    + """
-- Whether a rate limit counted `member` already: a script sent again (see held_already).
local function counted_already(p, count, member)
  for index = 0, count - 1 do
    local key, most = p .. 'rate:' .. ARGV[8 + 2 * index], tonumber(ARGV[9 + 2 * index])
    if most > 0 and redis.call('ZSCORE', key, member) then return true end
  end
  return false
end
local p, member, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local lease, amount, ttl, count = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local admitted, payers, used, reserved_by = standing(p, 8 + 2 * count, now_ms)
local refused, retry = -1, 0
if (amount > 0 and held_already(p, payers, lease, reserved_by)) or counted_already(p, count, member) then
  admitted = true
elseif admitted and not released_already(p, payers, lease, amount) then  -- (its request was refused)
  for index = 0, count - 1 do
    local key, most = p .. 'rate:' .. ARGV[8 + 2 * index], tonumber(ARGV[9 + 2 * index])
    if most > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms - window)
      if refused < 0 and redis.call('ZCARD', key) >= most then
        local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
        refused, retry = index, tonumber(oldest[2]) + window - now_ms
      end
    end
  end
  if refused < 0 then
    for index = 0, count - 1 do
      local key, most = p .. 'rate:' .. ARGV[8 + 2 * index], tonumber(ARGV[9 + 2 * index])
      if most > 0 then
        redis.call('ZADD', key, now_ms, member)
        redis.call('PEXPIRE', key, window)
      end
    end
    hold(p, payers, lease, amount, now_ms + ttl)
  end
end
return {admitted and 1 or 0, now_ms, cjson.encode(used), cjson.encode(reserved_by), refused, retry}
"""
)

# ARGV: prefix, lease, tokens, then the limits (see read_limit).
SETTLE = (
    _NOW
    + _LEDGER
    + """
local p, lease, tokens = ARGV[1], ARGV[2], tonumber(ARGV[3])
local i = 4
while i <= #ARGV do
  local payer, allowances
  payer, allowances, i = read_limit(i)
  local due = tokens
  -- A settlement sent again (its reply was lost: redis-py's retry, the store link's) charges once.
  local settled = p .. 'settled:' .. payer
  redis.call('ZREMRANGEBYSCORE', settled, '-inf', now_ms)
  if redis.call('ZADD', settled, 'NX', now_ms + SETTLED_MEMORY_MS, lease) == 0 then
    due = 0
  else
    redis.call('PEXPIRE', settled, SETTLED_MEMORY_MS)
    if redis.call('ZREM', p .. 'res:' .. payer, lease) == 0 then
      local lapsed = redis.call('HGET', p .. 'lapsed:' .. payer, lease)
      if lapsed then  -- charged whole when it lapsed: only what the call cost beyond that
        due = math.max(0, tokens - tonumber(lapsed))
        redis.call('HDEL', p .. 'lapsed:' .. payer, lease)
      end
    end
  end
  redis.call('HDEL', p .. 'resamt:' .. payer, lease)
  charge(p, payer, allowances, due, now_ms)
end
return 1
"""
)

# ARGV: prefix, key, limit, holder, ttl_ms. A holder that gave its slot back already is refused:
# it gave up waiting for this script's reply and released the slot, on another connection, and
# that release overtook it.
ACQUIRE = (
    _NOW
    + """
local key, limit, holder, ttl = ARGV[1] .. 'slots:' .. ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if redis.call('ZSCORE', ARGV[1] .. 'released:' .. ARGV[2], holder) then return 0 end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
if redis.call('ZCARD', key) >= limit and not redis.call('ZSCORE', key, holder) then return 0 end
redis.call('ZADD', key, now_ms + ttl, holder)
redis.call('PEXPIRE', key, ttl)
return 1
"""
)

# ARGV: prefix, key, holder, ttl_ms. The holder is remembered as long as a slot's lease lasts.
RELEASE = (
    _NOW
    + """
local released, holder, ttl = ARGV[1] .. 'released:' .. ARGV[2], ARGV[3], tonumber(ARGV[4])
redis.call('ZREM', ARGV[1] .. 'slots:' .. ARGV[2], holder)
redis.call('ZREMRANGEBYSCORE', released, '-inf', now_ms)
redis.call('ZADD', released, now_ms + ttl, holder)
redis.call('PEXPIRE', released, ttl)
return 1
"""
)

# ARGV: prefix, ttl_ms, then per lease: kind, key, lease.
RENEW = (
    _NOW
    + """
local p, ttl = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  local zset = (ARGV[i] == 'slot') and (p .. 'slots:' .. ARGV[i + 1]) or (p .. 'res:' .. ARGV[i + 1])
  redis.call('ZADD', zset, 'XX', now_ms + ttl, ARGV[i + 2])
  if ARGV[i] == 'slot' then redis.call('PEXPIRE', zset, ttl) end
end
return 1
"""
)


# ARGV: prefix, key, claimant, ttl_ms. The claimant asking again (its reply lost) is answered yes.
CLAIM = """
local key = ARGV[1] .. 'claim:' .. ARGV[2]
local held = redis.call('GET', key)
if held then return (held == ARGV[3]) and 1 or 0 end
redis.call('SET', key, ARGV[3], 'PX', tonumber(ARGV[4]))
return 1
"""


class RedisStore:
    """A `LedgerStore` in the Redis server at `url` (`redis://`, `rediss://`, `unix://`).

    A command that fails is tried again after a short backoff (twice), then reported as
    `StoreUnavailable`; the client reconnects on the next command.
    """

    shared = True

    def __init__(
        self,
        url: str,
        *,
        lease_seconds: float = LEASE_SECONDS,
        timeout: float = 2.0,
        prefix: str = "mcp-backfill:",
    ) -> None:
        self.description = hide_url_credentials(url)
        self.lease_seconds = lease_seconds
        self._prefix = prefix
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2),
            health_check_interval=30,
        )
        # A connection is built (not connected) now, so that a URL parameter it does not take is
        # found at startup (`TypeError`), like a bad port or value (`ValueError`), not by a request.
        self._client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (
                ("reserve", RESERVE),
                ("settle", SETTLE),
                ("admit", ADMIT),
                ("acquire", ACQUIRE),
                ("release", RELEASE),
                ("renew", RENEW),
                ("claim", CLAIM),
            )
        }

    @property
    def _ttl_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    async def _call(self, script: str, args: Sequence[Any]) -> Any:
        try:
            return await self._scripts[script](keys=[], args=list(args))
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(self.description, _cause(exc)) from None

    async def reserve(self, limits: Sequence[Limit], lease: str, amount: int) -> Standing:
        args: list[Any] = [self._prefix, lease or "-", amount, self._ttl_ms, *_limit_args(limits)]
        admitted, now_ms, used, reserved = await self._call("reserve", args)
        return _standing(admitted, now_ms, used, reserved)

    async def admit(
        self, limits: Sequence[Limit], rates: Sequence[Rate], member: str, lease: str = "", amount: int = 0
    ) -> tuple[Standing, RateRefusal | None]:
        args: list[Any] = [
            self._prefix,
            member,
            round(RATE_WINDOW_SECONDS * 1000),
            lease or "-",
            amount,
            self._ttl_ms,
            len(rates),
        ]
        for rate in rates:
            args += [rate.key, rate.per_minute]
        admitted, now_ms, used, reserved, index, retry_ms = await self._call(
            "admit", [*args, *_limit_args(limits)]
        )
        refusal = None if int(index) < 0 else RateRefusal(int(index), int(retry_ms) / 1000)
        return _standing(admitted, now_ms, used, reserved), refusal

    async def settle(self, limits: Sequence[Limit], lease: str, tokens: int) -> None:
        await self._call("settle", [self._prefix, lease or "-", tokens, *_limit_args(limits)])

    async def acquire_slot(self, key: str, limit: int, holder: str) -> bool:
        return bool(await self._call("acquire", [self._prefix, key, limit, holder, self._ttl_ms]))

    async def release_slot(self, key: str, holder: str) -> None:
        await self._call("release", [self._prefix, key, holder, self._ttl_ms])

    async def renew(self, held: Sequence[Held]) -> None:
        if not held:
            return
        args: list[Any] = [self._prefix, self._ttl_ms]
        for each in held:
            args += [each.kind, each.key, each.lease]
        await self._call("renew", args)

    async def claim(self, key: str, claimant: str, until: float) -> bool:
        ttl_ms = max(1, round((until - time.time()) * 1000))  # the claim's life, on Redis's clock
        return bool(await self._call("claim", [self._prefix, key, claimant, ttl_ms]))

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(self.description, _cause(exc)) from None

    async def aclose(self) -> None:
        await self._client.aclose()


def _limit_args(limits: Sequence[Limit]) -> list[Any]:
    args: list[Any] = []
    for limit in limits:
        args += [limit.key, len(limit.allowances), 1 if limit.total else 0]
        for each in limit.allowances:
            args += [each.window or "", _seconds(each.window), each.tokens]
    return args


def _standing(admitted: Any, now_ms: Any, used: Any, reserved: Any) -> Standing:
    return Standing(
        tuple(tuple(int(x) for x in _list(row)) for row in _list(json.loads(used))),
        tuple(int(x) for x in _list(json.loads(reserved))),
        int(now_ms) / 1000,
        bool(admitted),
    )


def _seconds(window: str | None) -> int:
    return 0 if window is None else int(BUDGET_WINDOWS[window])


def _list(value: Any) -> list[Any]:
    """A decoded Lua table: cjson encodes an empty one as `{}`."""
    return value if isinstance(value, list) else []


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
