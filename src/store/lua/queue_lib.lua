-- Helpers of the queue scripts (queue_*.lua), prepended after lib.lua. The model these
-- scripts follow, call for call, is QueueState in src/store/queue.rs; the constants
-- (charge per record, records dropped per call, feed length) come from the caller.
--
-- Key names arrive in KEYS; each script passes them to these helpers as a table:
--   t  queue:<terminal>   hash id -> record JSON (pushes not final)
--   b  bodies:<terminal>  hash id -> body
--   o  order:<terminal>   zset id -> acceptance sequence
--   c  collapse:<terminal> hash "tenant\ncollapse key" -> id of the queued push
--   s  waiting:<shard>    hash terminal -> pushes not final
--   u  queue-usage        hash bytes, n, t:<tenant>
--   d  done:<tenant>      hash id -> final record JSON
--   r  drops:<tenant>     zset id -> when the final record is dropped (ms)
--   f  feed:<tenant>      stream of final records (field r)

-- The store generation's id, created (as check_gen does) when missing.
local function current_gen(gen_key, nonce)
  local id = redis.call('HGET', gen_key, 'id')
  if id then
    return id
  end
  local sec, usec, now = clock()
  id = string.format('%s.%06d-%s', sec, tonumber(usec), nonce)
  redis.call('HSET', gen_key, 'id', id, 'created_ms', int(now))
  return id
end

-- Adds `delta` bytes to the cluster's and the tenant's charge.
local function charge(k, tenant, delta)
  redis.call('HINCRBY', k.u, 'bytes', delta)
  redis.call('HINCRBY', k.u, 't:' .. tenant, delta)
end

-- Drops up to `n` of the tenant's final records whose drop time is at or before `now`.
local function gc(k, tenant, now, n, per_record)
  local due = redis.call('ZRANGEBYSCORE', k.r, '-inf', now, 'LIMIT', 0, n)
  for _, id in ipairs(due) do
    redis.call('HDEL', k.d, id)
    redis.call('ZREM', k.r, id)
  end
  if #due > 0 then
    charge(k, tenant, -#due * per_record)
  end
end

-- Moves the not-final push `id` (its record `old`, decoded) to its final record
-- `done` (JSON), kept until `drop_at`, and appends it to the tenant's feed.
local function finish(k, id, old, done, drop_at, per_record, feed_max)
  redis.call('HDEL', k.t, id)
  redis.call('HDEL', k.b, id)
  redis.call('ZREM', k.o, id)
  if old.collapse_key then
    local field = old.tenant .. '\n' .. old.collapse_key
    if redis.call('HGET', k.c, field) == id then
      redis.call('HDEL', k.c, field)
    end
  end
  if redis.call('HINCRBY', k.s, old.terminal, -1) <= 0 then
    redis.call('HDEL', k.s, old.terminal)
  end
  charge(k, old.tenant, per_record - old.bytes)
  redis.call('HINCRBY', k.u, 'n', -1)
  redis.call('XADD', k.f, 'MAXLEN', '~', feed_max, '*', 'r', done)
  redis.call('HSET', k.d, id, done)
  redis.call('ZADD', k.r, drop_at, id)
end

-- `record` (decoded) moved to final `state` at `at`, one revision on, as JSON.
local function finished(record, state, at)
  record.rev = record.rev + 1
  record.state = state
  record.at_ms = at
  return cjson.encode(record)
end
