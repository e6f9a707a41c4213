-- queue_enqueue: a new push for a terminal's queue (QueueState::enqueue).
-- KEYS: 1 gen, 2 queue-seq, 3 queue-usage, 4 queue:<t>, 5 bodies:<t>, 6 order:<t>,
--   7 collapse:<t>, 8 waiting:<shard>, 9 done:<tenant>, 10 drops:<tenant>,
--   11 feed:<tenant>, 12 terminals:<shard>, 13 lease:<shard>
-- ARGV: 1 nonce, 2 id, 3 record JSON (queued, rev 1), 4 body, 5 check the directory
--   (1/0), 6 pod, 7 per-terminal bound, 8 tenant bytes, 9 cluster bytes, 10 retention
--   ms, 11 charge per record, 12 drops per call, 13 feed length, 14 events channel,
--   15 shard
-- Reply: {'accepted', position, generation, replaced key or ''} | {'existing', JSON,
--   generation} | {'conflict'} | {'full', bound} | {'unknown_terminal'}
local k = {u = KEYS[3], t = KEYS[4], b = KEYS[5], o = KEYS[6], c = KEYS[7], s = KEYS[8],
  d = KEYS[9], r = KEYS[10], f = KEYS[11]}
local id = ARGV[2]
local per_record, per_call = tonumber(ARGV[11]), tonumber(ARGV[12])
local gen = current_gen(KEYS[1], ARGV[1])
local rec = cjson.decode(ARGV[3])
local now = rec.accepted_ms
gc(k, rec.tenant, now, per_call, per_record)
local existing = redis.call('HGET', k.t, id) or redis.call('HGET', k.d, id)
if existing then
  if cjson.decode(existing).digest == rec.digest then
    -- Another pod may have written the record and not seen it replicated yet: a write
    -- of ours after it makes the WAIT behind this call cover it (replication is one
    -- ordered stream), so a 202 from here never rests on a record a failover can lose.
    redis.call('INCR', KEYS[2])
    return {'existing', existing, gen}
  end
  return {'conflict'}
end
if ARGV[5] == '1' and redis.call('HEXISTS', KEYS[12], rec.terminal) == 0 then
  return {'unknown_terminal'}
end
local cand, old
if rec.collapse_key then
  cand = redis.call('HGET', k.c, rec.tenant .. '\n' .. rec.collapse_key)
  if cand then
    local json = redis.call('HGET', k.t, cand)
    if json then
      old = cjson.decode(json)
    end
    if not old or old.state ~= 'queued' then
      cand, old = nil, nil
    end
  end
end
local count, freed, kept = redis.call('ZCARD', k.o), 0, 0
if cand then
  count, freed, kept = count - 1, old.bytes, per_record
end
local function after(used)
  local v = used + rec.bytes + kept - freed
  if v < 0 then
    v = 0
  end
  return v
end
if count + 1 > tonumber(ARGV[7]) then
  return {'full', 'terminal_pushes'}
end
if after(tonumber(redis.call('HGET', k.u, 't:' .. rec.tenant) or '0')) > tonumber(ARGV[8]) then
  return {'full', 'tenant_bytes'}
end
if after(tonumber(redis.call('HGET', k.u, 'bytes') or '0')) > tonumber(ARGV[9]) then
  return {'full', 'cluster_bytes'}
end
local replaced = ''
if cand then
  replaced = old.key
  old.replaced_by = rec.key
  local done = finished(old, 'replaced', now)
  finish(k, cand, old, done, now + tonumber(ARGV[10]), per_record, tonumber(ARGV[13]))
end
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', k.o, seq, id)
redis.call('HSET', k.t, id, ARGV[3])
redis.call('HSET', k.b, id, ARGV[4])
if rec.collapse_key then
  redis.call('HSET', k.c, rec.tenant .. '\n' .. rec.collapse_key, id)
end
redis.call('HINCRBY', k.s, rec.terminal, 1)
charge(k, rec.tenant, rec.bytes)
redis.call('HINCRBY', k.u, 'n', 1)
if redis.call('GET', KEYS[13]) ~= ARGV[6] then
  redis.call('PUBLISH', ARGV[14], 'queue ' .. ARGV[15] .. ' ' .. rec.terminal)
end
return {'accepted', redis.call('ZCARD', k.o), gen, replaced}
