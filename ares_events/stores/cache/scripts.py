"""The cache's Lua scripts, each one atomic in Redis: writing a stream's cached tail
(:data:`WRITE_SCRIPT`), dropping tails after an erasure or a retirement
(:data:`DROP_SCRIPT`) and reading the erasure epoch (:data:`EPOCH_SCRIPT`).

The erasure epoch is a random value under ``<ns>epoch`` that every erasure and every
retirement of archived events replaces (in the same script that drops the streams' tails).
A writer passes the epoch it knew before it read (or appended) the events it writes; a
different one means an erasure or a retirement may have happened since, and the write is
refused. So a tail dropped by either is never written again from events read before it. A
lost epoch (evicted, flushed) is replaced by a new one, which refuses every writer that
knew the old: it cannot tell what was erased meanwhile. Every script returns the current
epoch, for the writer's next write.

It imports nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DROP_SCRIPT", "EPOCH_SCRIPT", "WRITE_SCRIPT"]

# KEYS[1] the erasure epoch. ARGV[1] a new epoch, used when there is none.
EPOCH_SCRIPT: Final = """
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[1]
  redis.call('SET', KEYS[1], epoch)
end
return epoch
"""

# KEYS[1] the erasure epoch, KEYS[2..] the stream hashes to drop (none: the epoch only).
# ARGV[1] the new epoch. SET and DEL take a key of any type: this also replaces a value of
# another type written there.
DROP_SCRIPT: Final = """
redis.call('SET', KEYS[1], ARGV[1])
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return ARGV[1]
"""

# Writes a contiguous run of events to a stream's cached tail, atomically.
# KEYS[1] stream hash, KEYS[2] the erasure epoch. ARGV: 1 first version, 2 last version,
# 3 prev_hash of the first event, 4 hash of the last, 5 tail size, 6 ttl, 7 force ("1":
# replace whatever is there), 8 wake-up channel ("" for none), 9 message, 10 the epoch the
# writer knew before it read or appended the events, 11 a new epoch for when there is
# none, 12.. one entry per version from the first.
# Fields: v = version of the newest cached event, h = its hash, f = oldest cached version,
# e:<version> = entry. Without force, a run that does not extend the cached tail (its
# prev_hash is not the cached h) replaces it, and a run not newer than the cache is
# ignored (a concurrent writer got there first). Fields that are not numbers (edited in
# Redis) make the run replace the tail rather than fail the script.
WRITE_SCRIPT: Final = """
if ARGV[8] ~= '' then redis.call('PUBLISH', ARGV[8], ARGV[9]) end
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = ARGV[11]
  redis.call('SET', KEYS[2], epoch)
end
if epoch ~= ARGV[10] then return epoch end
local key = KEYS[1]
local first = tonumber(ARGV[1])
local last = tonumber(ARGV[2])
local keep = tonumber(ARGV[5])
local cur = redis.call('HMGET', key, 'v', 'h', 'f')
local v = tonumber(cur[1] or '') or 0
local cf = tonumber(cur[3] or '')
local force = ARGV[7] == '1'
if (not force) and v >= last then return epoch end
local f = first
if (not force) and v > 0 and v == first - 1 and cur[2] == ARGV[3] and cf then
  f = cf
else
  redis.call('DEL', key)
end
for i = 0, last - first do
  redis.call('HSET', key, 'e:' .. (first + i), ARGV[12 + i])
end
local lo = last - keep + 1
if lo > f then
  for x = f, lo - 1 do redis.call('HDEL', key, 'e:' .. x) end
  f = lo
end
redis.call('HSET', key, 'v', last, 'h', ARGV[4], 'f', f)
redis.call('EXPIRE', key, tonumber(ARGV[6]))
return epoch
"""
