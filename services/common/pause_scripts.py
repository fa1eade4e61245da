"""The Lua of a program's tool pause: its predicted remaining work kept in its engine's load while it waits.

NOTE(pause): a stage's in-flight entry is the whole remaining workflow's ŷ, released when the stage ends. A
stage that ends in tool calls is followed by another once the tool has run, so releasing all of it would hide
the program's remaining work from the load balancer for the length of the tool pause. COMPLETE therefore
keeps ŷ minus the stage's output in the engine's ``load`` under the program's id (``Keys.paused``, with its
deadline in ``Keys.pause_deadlines``), and takes no running slot or queue place for it. The program's next
stage takes it back (RESUME, on the engine the program was on, just before its own ŷ is charged); a program
that ends takes it back too; one that never comes back lapses at its deadline, its program row's idle TTL
(EXPIRE_PAUSES, run with the reaper). Every key is tagged with the engine: one slot of a Redis Cluster.
"""

from __future__ import annotations

# Keep ``tokens`` in the engine's load for program ``pid`` until ``deadline_ms`` (a pause already held
# for it is replaced, not added to).
PAUSE = """
local function pause(paused, deadlines, info, pid, tokens, deadline_ms)
  local old = tonumber(redis.call('HGET', paused, pid) or '0')
  redis.call('HSET', paused, pid, tokens)
  redis.call('ZADD', deadlines, deadline_ms, pid)
  redis.call('HINCRBY', info, 'load', tokens - old)
end
"""

_TAKE_BACK = """
local function take_back(paused, deadlines, info, pid)
  local t = redis.call('HGET', paused, pid)
  if not t then return 0 end
  redis.call('HDEL', paused, pid)
  redis.call('ZREM', deadlines, pid)
  redis.call('HINCRBY', info, 'load', -tonumber(t))
  return tonumber(t)
end
"""

# KEYS: paused, deadlines, info
# ARGV: program_id
# The program's pause on this engine ends (its next stage is being dispatched, or it ended). Returns the
# tokens taken back from the load, 0 when it held none here.
RESUME = (
    _TAKE_BACK
    + """
return take_back(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
"""
)

# KEYS: paused, deadlines, info
# Ends every pause past its deadline (on Redis's clock). Returns the program ids whose pause lapsed.
EXPIRE_PAUSES = (
    _TAKE_BACK
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, pid in ipairs(gone) do take_back(KEYS[1], KEYS[2], KEYS[3], pid) end
return gone
"""
)
