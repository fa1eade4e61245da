"""The Lua scripts of an engine's queue: each multi-key change to its requests, claims and load.

Each script is headed by the ``KEYS`` and ``ARGV`` it takes and what it returns; ``QueueStore`` is their
only caller. A program's row and the job leases have their own scripts (``program_scripts``), and tenant
quotas theirs (``services.dispatcher.quota_scripts``).

NOTE(atomicity): each queue script touches only keys tagged with one engine (``{engine}``), so it runs in one
slot of a Redis Cluster. Request hashes and output streams are addressed as ``ARGV`` prefix + request id;
the prefix carries the same hash tag, which keeps those keys in the script's slot.

Request states: queued -> running -> done | failed | cancelled. ``attempt`` counts claims; it fences every
write a worker makes, so a worker whose lease expired (and whose request was re-run elsewhere) can never
complete it a second time.
"""

from __future__ import annotations

from services.common.pause_scripts import PAUSE

# Release a request's in-flight accounting (the paper's I[m] entry) exactly once, and its tenant's part of it.
# A tenant's request ids read ``tenant~id`` (services.dispatcher.tenancy; neither part holds a ``~``), so the
# tenant is read back from the id: no script needs another argument to release it. Tenant "" (ids without
# ``~``) keeps no tenant fields. A tenant holding nothing more leaves the engine's active weights (fairness).
_RELEASE = """
local function release(inflight, info, id)
  local y = redis.call('HGET', inflight, id)
  if y then
    redis.call('HDEL', inflight, id)
    redis.call('HINCRBY', info, 'load', -tonumber(y))
    redis.call('HINCRBY', info, 'drained', tonumber(y))
    local t = string.match(id, '^(.+)~')
    if t and redis.call('HINCRBY', info, 'tenant_load:' .. t, -tonumber(y)) <= 0 then
      local w = redis.call('HGET', info, 'tenant_weight:' .. t) or '0'
      redis.call('HINCRBY', info, 'tenant_weights', -tonumber(w))
      redis.call('HDEL', info, 'tenant_load:' .. t, 'tenant_weight:' .. t)
    end
  end
end
"""

# Lease deadlines are on Redis's clock: a deadline the worker computed before a command that then waited out
# a Redis stall would already be past when it landed (and workers, reapers on other hosts disagree anyway).
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# Every event of a request goes out through emit: appended to the request's output stream (which expires
# ttl after its last event; trimmed to maxlen when given), and copied (request id, stream entry id, event)
# into the engine's notify stream, which each dispatcher process reads with one blocking XREAD for all its
# streams. The request's own stream stays the record a late reader catches up from.
_EMIT = """
local function emit(out, notify, rid, ev, ttl, notify_maxlen, maxlen)
  local sid
  if maxlen then
    sid = redis.call('XADD', out, 'MAXLEN', '~', maxlen, '*', 'ev', ev)
  else
    sid = redis.call('XADD', out, '*', 'ev', ev)
  end
  redis.call('EXPIRE', out, ttl)
  redis.call('XADD', notify, 'MAXLEN', '~', notify_maxlen, '*', 'r', rid, 'i', sid, 'e', ev)
end
"""

# KEYS: notify, then (output, req) per delta
# ARGV: stream_maxlen, ttl_s, notify_maxlen, then (id, event_json, attempt, end, note_head) per delta
# Appends each delta event to its request's output stream (which expires ttl_s after its last event), only
# while ``attempt`` holds the running request: a worker whose lease was lost (its request re-run elsewhere)
# cannot write into the stream the new attempt is filling, so no reader ever gets two attempts' text.
# ``end`` is the attempt's text length once this delta is in; the request keeps the last one written
# ('sent', reset by each CLAIM), so a write retried after its reply was lost is not appended twice.
# Many deltas per call, and ONE notify entry for all of them (field 'm': a JSON list of [request id, stream
# id, event], ``note_head`` being the JSON of '[<request id>,'): a worker's flush was one EVALSHA and one
# notify entry per request, and packing, parsing and dispatching those per delta was most of the relay's
# CPU in the worker and the dispatcher's hub (profiled, bench/results/cpu_profile.md). An engine's keys
# share its hash tag, so one call is one slot in a cluster too.
# Returns 1 per delta appended, 0 per delta fenced off, in order.
PUBLISH = """
local out, notes = {}, {}
for i = 0, (#KEYS - 1) / 2 - 1 do
  local stream, req, a = KEYS[2 + 2 * i], KEYS[3 + 2 * i], 4 + 5 * i
  local f = redis.call('HMGET', req, 'attempt', 'state', 'sent')
  if f[1] == ARGV[a + 2] and f[2] == 'running' and tonumber(f[3] or '0') < tonumber(ARGV[a + 3]) then
    redis.call('HSET', req, 'sent', ARGV[a + 3])
    local sid = redis.call('XADD', stream, 'MAXLEN', '~', ARGV[1], '*', 'ev', ARGV[a + 1])
    redis.call('EXPIRE', stream, ARGV[2])
    notes[#notes + 1] = ARGV[a + 4] .. '"' .. sid .. '",' .. ARGV[a + 1] .. ']'
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
if #notes > 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'm', '[' .. table.concat(notes, ',') .. ']')
end
return out
"""

# KEYS: req
# ARGV: now_s
# A client's retry re-attaches to the request: records when (so that the cancel its broken first call left
# behind spares it). Returns {program_id, y, y90, score, t_enq, state}, or {} if there is no such request
# (nothing is written then: a hash created here would never expire).
REATTACH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSET', KEYS[1], 'reattached', ARGV[1])
return redis.call('HMGET', KEYS[1], 'program_id', 'y', 'y90', 'score', 't_enq', 'state')
"""

# KEYS: req, inflight, info, queue, wake
# ARGV: id, payload, y, y90, score, t_enq, queue_ttl_s (how long it may wait), decision, program_id,
#       max_load (in-flight tokens the engine may already hold for this request to join; 0: no bound),
#       weight (the tenant's fair-share weight; default 1)
# Returns 1 when enqueued, 0 when the request id already exists, -1 when the engine holds more than
# max_load (nothing is changed in either case). The bound is checked here, with the write, because
# concurrent dispatches all read the engine's load before any of them adds to it. A tenant's request (id
# ``tenant~id``) also adds to its part of the load and puts its weight among the engine's active weights,
# what the fairness term reads (services.policy.fairness); release takes both back.
ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local max_load = tonumber(ARGV[10] or '0')
if max_load > 0 and tonumber(redis.call('HGET', KEYS[3], 'load') or '0') > max_load then return -1 end
redis.call('HSET', KEYS[1], 'payload', ARGV[2], 'y', ARGV[3], 'y90', ARGV[4], 'score', ARGV[5],
           't_enq', ARGV[6], 'state', 'queued', 'attempt', 0, 'decision', ARGV[8], 'program_id', ARGV[9])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'load', ARGV[3])
local t = string.match(ARGV[1], '^(.+)~')
if t then
  local w = tonumber(ARGV[11] or '1')
  local old = tonumber(redis.call('HGET', KEYS[3], 'tenant_weight:' .. t) or '0')
  redis.call('HINCRBY', KEYS[3], 'tenant_weights', w - old)
  redis.call('HSET', KEYS[3], 'tenant_weight:' .. t, w)
  redis.call('HINCRBY', KEYS[3], 'tenant_load:' .. t, ARGV[3])
end
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1])
redis.call('RPUSH', KEYS[5], 1)
redis.call('LTRIM', KEYS[5], -1, -1)
return 1
"""

# KEYS: queue, claims, inflight, info, wake
# ARGV: n, lease_ms, worker_id, now_s, req_prefix, max_attempts (when info has none)
# Pops up to n requests in score order and claims each. A request on its last chance (charged with
# max_attempts - 1 worker deaths, see GIVE_BACK) runs alone: it is claimed only while the engine holds no
# other claim, nothing is claimed past it meanwhile (it keeps its place), and while it runs the engine
# claims nothing else (``isolating`` in info names it until it no longer runs). A claim that empties the
# queue silences the doorbell: its ring announced requests claimed now, and left in place it would wake a
# worker to claim nothing.
# Returns {id, payload, y, y90, t_enq, attempt, t_first_claim}*.
CLAIM = (
    _RELEASE
    + _NOW_MS
    + """
local deadline = now_ms() + tonumber(ARGV[2])
local limit = tonumber(redis.call('HGET', KEYS[4], 'max_attempts') or ARGV[6] or '3')
local alone = redis.call('HGET', KEYS[4], 'isolating')
if alone then
  if redis.call('HGET', ARGV[5] .. alone, 'state') == 'running' then return {} end
  redis.call('HDEL', KEYS[4], 'isolating')
end
local out = {}
for _ = 1, tonumber(ARGV[1]) do
  local popped = redis.call('ZPOPMIN', KEYS[1])
  if #popped == 0 then
    redis.call('DEL', KEYS[5])
    break
  end
  local id = popped[1]
  local rk = ARGV[5] .. id
  local g = redis.call('HMGET', rk, 'state', 'deaths')
  if g[1] == 'queued' then
    local last = limit > 1 and tonumber(g[2] or '0') >= limit - 1
    if last and (#out > 0 or redis.call('ZCARD', KEYS[2]) > 0) then
      redis.call('ZADD', KEYS[1], popped[2], id)
      break
    end
    local attempt = redis.call('HINCRBY', rk, 'attempt', 1)
    redis.call('HSET', rk, 'state', 'running', 'worker', ARGV[3], 't_claim', ARGV[4], 'sent', 0)
    -- Its queue wait is over: nothing expires while it runs (its lease guards against a dead worker).
    redis.call('PERSIST', rk)
    if attempt == 1 then redis.call('HSET', rk, 't_first_claim', ARGV[4]) end
    redis.call('ZADD', KEYS[2], deadline, id)
    local f = redis.call('HMGET', rk, 'payload', 'y', 'y90', 't_enq', 't_first_claim')
    out[#out + 1] = {id, f[1], f[2], f[3], f[4], tostring(attempt), f[5]}
    if last then
      redis.call('HSET', KEYS[4], 'isolating', id)
      break
    end
  else
    -- Its hash expired while it waited (retention passed): nobody is listening; free its load.
    release(KEYS[3], KEYS[4], id)
  end
end
return out
"""
)

# KEYS: claims
# ARGV: lease_ms, req_prefix, then id, attempt pairs
# Extends the leases the caller still holds. Returns {lost_ids, cancel_ids}: requests whose lease the
# caller no longer holds (re-run elsewhere or finished), and requests someone asked to cancel.
RENEW = (
    _NOW_MS
    + """
local deadline = now_ms() + tonumber(ARGV[1])
local lost, cancel = {}, {}
for i = 3, #ARGV, 2 do
  local id, attempt = ARGV[i], ARGV[i + 1]
  local rk = ARGV[2] .. id
  local f = redis.call('HMGET', rk, 'attempt', 'state', 'cancel')
  if f[1] ~= attempt or f[2] ~= 'running' then
    lost[#lost + 1] = id
  else
    redis.call('ZADD', KEYS[1], 'XX', deadline, id)
    if f[3] then cancel[#cancel + 1] = id end
  end
end
return {lost, cancel}
"""
)

# KEYS: req, claims, inflight, info, output, traces, notify, paused, pause_deadlines[, program]
# ARGV: id, attempt, final_state, event_json, trace_json ('' for none), retention_s, stream_maxlen,
#       traces_maxlen, now_s, notify_maxlen, program_id, pause_tokens (0: none), pause_ms[, output_tokens]
# Returns 1 if this attempt still held the request and finished it, 0 otherwise (nothing changed).
# A stage that ends in tool calls keeps its program's predicted remaining work in the engine's load for
# pause_ms (``pause_scripts``), in the same step, so the caller's next stage always finds it to take back.
# With the program key (a single Redis; on a cluster the program lives in another slot and the worker credits
# it in a call of its own, CREDIT), the stage's output tokens join the program's attained service in the same
# step as the final event, so a caller's next stage always reads them; an ended program is never revived.
COMPLETE = (
    _RELEASE
    + _EMIT
    + _NOW_MS
    + PAUSE
    + """
local f = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if f[1] ~= ARGV[2] or f[2] ~= 'running' then return 0 end
if KEYS[10] and redis.call('EXISTS', KEYS[10]) == 1 then
  redis.call('HINCRBY', KEYS[10], 'attained', ARGV[14])
  redis.call('HSET', KEYS[10], 'last_output', ARGV[14])
end
redis.call('ZREM', KEYS[2], ARGV[1])
release(KEYS[3], KEYS[4], ARGV[1])
if tonumber(ARGV[12]) > 0 then
  pause(KEYS[8], KEYS[9], KEYS[4], ARGV[11], tonumber(ARGV[12]), now_ms() + tonumber(ARGV[13]))
end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 't_done', ARGV[9])
redis.call('EXPIRE', KEYS[1], ARGV[6])
emit(KEYS[5], KEYS[7], ARGV[1], ARGV[4], ARGV[6], ARGV[10], ARGV[7])
if ARGV[5] ~= '' then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*', 'row', ARGV[5])
end
return 1
"""
)

# KEYS: req, queue, inflight, info, output, notify
# ARGV: id, event_json, retention_s, now_s, notify_maxlen
# A queued request is removed and answered at once; a running one is flagged for its worker, which aborts
# the engine request and completes it as cancelled. Returns the state the request was found in.
CANCEL = (
    _RELEASE
    + _EMIT
    + """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if st == 'queued' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  release(KEYS[3], KEYS[4], ARGV[1])
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 't_done', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  emit(KEYS[5], KEYS[6], ARGV[1], ARGV[2], ARGV[3], ARGV[5])
elseif st == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', 1)
end
return st
"""
)

# A claim its worker lost by dying (the lease expired, or the engine died under a live worker) goes back to
# the queue with its original score (it keeps its place) and a fresh queue wait limit, or ends: cancelled if
# its client asked, failed as poison once charged with ``limit`` worker deaths. ``c`` holds the keys and
# arguments (see REAP). Returns true when re-queued.
#
# NOTE(poison): a request is charged one death per DISTINCT worker that died holding it (``died_on`` lists
# their ids: the same worker cannot charge it twice), never per claim, so a shutdown or a lease that merely
# lapsed does not push it toward the limit more than a crash does. A crash cannot say which request of a
# batch killed it, so every running claim is charged (a live worker whose engine died knows, and charges
# only what had started in the engine: RETURN_CLAIMS). Neighbours are spared by the last chance: a request
# charged ``limit - 1`` times runs alone (CLAIM), so the death that fails it is its own; a neighbour that
# crashed beside a poison request goes back to the queue and, at worst, runs alone once and succeeds.
_GIVE_BACK = """
local function give_back(id, charge, c)
  local rk = c.req_prefix .. id
  local f = redis.call('HMGET', rk, 'score', 'cancel', 'worker', 'deaths', 'died_on')
  local deaths = tonumber(f[4] or '0')
  local died_on = f[5] and cjson.decode(f[5]) or {}
  if charge then
    local seen = false
    for _, w in ipairs(died_on) do
      if w == (f[3] or '') then seen = true end
    end
    if not seen then
      died_on[#died_on + 1] = f[3] or ''
      deaths = deaths + 1
      redis.call('HSET', rk, 'deaths', deaths, 'died_on', cjson.encode(died_on))
    end
  end
  if f[2] or deaths >= c.limit then
    release(c.inflight, c.info, id)
    local ev = c.cancelled
    if not f[2] then
      ev = cjson.encode({t = 'error', code = 'INTERNAL', message = c.poison .. ': ' .. deaths ..
        ' workers died running it (' .. table.concat(died_on, ', ') .. '); it is not run again'})
    end
    redis.call('HSET', rk, 'state', f[2] and 'cancelled' or 'failed', 't_done', c.now)
    redis.call('EXPIRE', rk, c.retention)
    emit(c.out_prefix .. id, c.notify, id, ev, c.retention, c.notify_maxlen)
    return false
  end
  redis.call('HSET', rk, 'state', 'queued')
  redis.call('EXPIRE', rk, c.queue_ttl)
  redis.call('ZADD', c.queue, f[1], id)
  return true
end

-- GIVE_BACK's configuration from the ARGV both REAP and RETURN_CLAIMS start with: req_prefix, out_prefix,
-- max_attempts (when info has none), retention_s, poison_message, now_s, notify_maxlen, queue_ttl_s,
-- cancelled_event_json.
local function give_back_config()
  return {req_prefix = ARGV[1], out_prefix = ARGV[2], queue = KEYS[2], inflight = KEYS[3], info = KEYS[4],
          notify = KEYS[5], limit = tonumber(redis.call('HGET', KEYS[4], 'max_attempts') or ARGV[3]),
          retention = ARGV[4], poison = ARGV[5], now = ARGV[6], notify_maxlen = ARGV[7],
          queue_ttl = ARGV[8], cancelled = ARGV[9]}
end
"""

# KEYS: claims, queue, inflight, info, notify
# ARGV: req_prefix, out_prefix, max_attempts (when info has none), retention_s, poison_message, now_s,
#       notify_maxlen, queue_ttl_s, cancelled_event_json (leases are judged on Redis's clock)
# Gives back (GIVE_BACK) every claim whose lease expired, each charged with its worker's death. Returns the
# ids re-queued.
# NOTE(stall): if no reaper reached the engine for longer than its worker's lease (Redis paused or away),
# live workers could not renew meanwhile either, so an expired lease proves nothing yet: that round gives
# nothing back and lets them renew first; the next round reaps as usual.
REAP = (
    _RELEASE
    + _NOW_MS
    + _EMIT
    + _GIVE_BACK
    + """
local c = give_back_config()
local now = now_ms()
local f = redis.call('HMGET', KEYS[4], 'lease_ms', 'reaped_ms', 'reap_held')
if f[1] then  -- only a registered engine's hash: a hash created here would hold nothing else
  redis.call('HSET', KEYS[4], 'reaped_ms', now)
  if f[2] and not f[3] and now - tonumber(f[2]) > tonumber(f[1]) then
    redis.call('HSET', KEYS[4], 'reap_held', 1)
    return {}
  end
  if f[3] then redis.call('HDEL', KEYS[4], 'reap_held') end
end
local requeued = {}
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  local st = redis.call('HGET', ARGV[1] .. id, 'state')
  if st == 'running' then
    if give_back(id, true, c) then requeued[#requeued + 1] = id end
  elseif not st then
    release(KEYS[3], KEYS[4], id)
  end
end
return requeued
"""
)

# KEYS: claims, queue, inflight, info, notify
# ARGV: req_prefix, out_prefix, max_attempts (when info has none), retention_s, poison_message, now_s,
#       notify_maxlen, queue_ttl_s, cancelled_event_json, then (id, attempt, started '1' | '0') triples
# A live worker whose engine died hands its claims back at once instead of leaving them to expire: each one
# that attempt still holds is given back (GIVE_BACK), charged with the death only if it had started in the
# engine (a prefetched claim never reached it). Returns the ids re-queued.
RETURN_CLAIMS = (
    _RELEASE
    + _EMIT
    + _GIVE_BACK
    + """
local c = give_back_config()
local requeued = {}
for i = 10, #ARGV, 3 do
  local id = ARGV[i]
  local f = redis.call('HMGET', ARGV[1] .. id, 'attempt', 'state')
  if f[1] == ARGV[i + 1] and f[2] == 'running' then
    redis.call('ZREM', KEYS[1], id)
    if give_back(id, ARGV[i + 2] == '1', c) then requeued[#requeued + 1] = id end
  end
end
return requeued
"""
)
