"""The Lua scripts of tenant quotas: check and charge a stage in one step, and give a refused dispatch back.

NOTE(limits library): the tokens-per-minute counter is a small script rather than the ``limits`` package.
``limits`` builds its own Redis client from a URI, outside the dispatcher's shared client (its blocking pool
and its retry through a Redis restart, ``services.common.redis_client``), and its answer to "when may this
come back" is the window's reset, not when ``cost`` tokens fit; and the concurrency check is a script on the
tenant's slot anyway. One script on one slot (``{tenant:<name>}``) checks both quotas, charges both or
neither, and computes the Retry-After, in one round trip.

Clock: Redis's (TIME), so every dispatcher replica counts the same minute.
"""

from __future__ import annotations

# KEYS: workflows (tenant_workflows), tokens (tenant_tokens)
# ARGV: program_id, lapse_s (program_ttl_s), max_workflows (0: none), new ('1': a workflow's first stage),
#       cost (tokens), tokens_per_minute (0: none)
# A new workflow is refused when the tenant already holds max_workflows live ones; any stage is refused when
# its cost does not fit in the sliding minute (a cost above the whole quota counts as the quota: it runs
# alone in its minute rather than never). The sliding minute is the current minute's charge plus the
# previous minute's, weighted by how much of it is still inside the last 60 s.
# Returns {1, minute, added} when admitted and charged (added: 1 if the program was newly counted);
# {-1, 0, live} over max_workflows; {-2, retry_ms, used} over tokens_per_minute. Nothing is written when
# refused.
QUOTA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lapse, max_wf = tonumber(ARGV[2]), tonumber(ARGV[3])
local new, cost, tpm = ARGV[4] == '1', tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if new and not held and max_wf > 0 then
  local live = redis.call('ZCARD', KEYS[1])
  if live >= max_wf then return {-1, 0, live} end
end
local minute = math.floor(now / 60)
local f = redis.call('HMGET', KEYS[2], 'window', 'cur', 'prev')
local w, cur, prev = tonumber(f[1] or '-2'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
if w ~= minute then
  if w == minute - 1 then prev = cur else prev = 0 end
  cur = 0
end
local into = now / 60 - minute
local used = prev * (1 - into) + cur
if tpm > 0 then
  local c = math.min(cost, tpm)
  if used + c > tpm then
    local room, wait = tpm - c - cur, 0
    if room >= 0 and prev > 0 then
      wait = (1 - room / prev - into) * 60  -- the previous minute's part fades enough within this one
    else
      wait = (1 - into + 1 - (tpm - c) / math.max(cur, 1)) * 60  -- this minute's charge must fade next minute
    end
    return {-2, math.ceil(math.max(wait, 0.001) * 1000), math.floor(used)}
  end
end
redis.call('HSET', KEYS[2], 'window', minute, 'cur', cur + cost, 'prev', prev)
redis.call('EXPIRE', KEYS[2], 120)
redis.call('ZADD', KEYS[1], now + lapse, ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(lapse))
return {1, minute, held and 0 or 1}
"""

# KEYS: workflows, tokens
# ARGV: program_id, added ('1': QUOTA counted the program just now), cost, minute (QUOTA's)
# Gives back what QUOTA charged for a dispatch that was then refused (engine full, duplicate id): the
# program's place if QUOTA added it, and its tokens if the minute has not turned meanwhile.
REFUND = """
if ARGV[2] == '1' then redis.call('ZREM', KEYS[1], ARGV[1]) end
if redis.call('HGET', KEYS[2], 'window') == ARGV[4] then
  redis.call('HINCRBY', KEYS[2], 'cur', -tonumber(ARGV[3]))
end
return 1
"""
