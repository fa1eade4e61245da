"""The Lua scripts on one key each: a program's row (``QueueStore``) and a job's lease (the export job and
the reaper). Each is headed by the ``KEYS`` and ``ARGV`` it takes and what it returns.

NOTE(atomicity): a program script touches its program's key only and a lease script the ``{jobs}`` tag, so
each runs in one slot of a Redis Cluster.
"""

from __future__ import annotations

# KEYS: program
# ARGV: engine, model, workflow, stage, request_id, ttl_s, confidences_json, now_s, moved_from
# Records a program's engine on its first stage and checks later stages. A later stage moves the program
# to ``engine`` when ``moved_from`` names its (dead) engine. Returns {status, engine, model}: status 'new' |
# 'ok' | 'backwards' (stage index lower than the last one seen) | 'duplicate' (the request id is the
# program's current request: a retry); nothing is changed unless 'new' or 'ok'.
ASSIGN = """
local f = redis.call('HMGET', KEYS[1], 'engine', 'model', 'stage', 'request_id')
if not f[1] then
  redis.call('HSET', KEYS[1], 'engine', ARGV[1], 'model', ARGV[2], 'workflow', ARGV[3], 'stage', ARGV[4],
             'request_id', ARGV[5], 'confidences', ARGV[7], 'created', ARGV[8], 'updated', ARGV[8])
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  return {'new', ARGV[1], ARGV[2]}
end
if f[4] == ARGV[5] then return {'duplicate', f[1], f[2]} end
if tonumber(ARGV[4]) < tonumber(f[3]) then return {'backwards', f[1], f[2]} end
if ARGV[9] and ARGV[9] ~= '' and f[1] == ARGV[9] then
  redis.call('HSET', KEYS[1], 'engine', ARGV[1], 'model', ARGV[2])
  f[1], f[2] = ARGV[1], ARGV[2]
end
redis.call('HSET', KEYS[1], 'stage', ARGV[4], 'request_id', ARGV[5], 'updated', ARGV[8])
redis.call('EXPIRE', KEYS[1], ARGV[6])
return {'ok', f[1], f[2]}
"""

# KEYS: program
# ARGV: tokens
# Credits a finished stage's output tokens to its program's attained service (what MLFQ orders by) and
# keeps them as its last stage's output (what the predictor of open loops reads). A
# program already ended or expired is left alone: HINCRBY alone would re-create it without a TTL.
CREDIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'last_output', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'attained', ARGV[1])
"""

# KEYS: program
# ARGV: request_id
# Undoes a fresh assignment (ASSIGN's 'new') whose request could not be enqueued, only if the program still
# names that request: another stage may have taken it over meanwhile. Returns 1 if deleted, else 0.
UNASSIGN = """
if redis.call('HGET', KEYS[1], 'request_id') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lock, cursor
# ARGV: token, lease_ms, field, value
# Records the export cursor and renews the lease in one step, only while the lease is still ours.
# Returns 1 if recorded, 0 if the lease was lost (another export took over: nothing changed).
EXPORT_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: lock
# ARGV: token, lease_ms
# Takes a free lease, or extends it if the caller holds it. Returns 1 if the caller holds it now, else 0.
LEASE_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: lock
# ARGV: token
# Deletes a lease only if it is still ours. Returns 1 if deleted, else 0.
LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
