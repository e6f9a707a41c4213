-- queue_write: a compare-and-set of one push's record (QueueState::write).
-- KEYS: 1 queue-usage, 2 queue:<t>, 3 bodies:<t>, 4 order:<t>, 5 collapse:<t>,
--   6 waiting:<shard>, 7 done:<tenant>, 8 drops:<tenant>, 9 feed:<tenant>,
--   10 lease:<shard>, 11 epochs
-- ARGV: 1 id, 2 expected revision, 3 new record JSON, 4 change: mark | unsent | final,
--   5 pod, 6 epoch, 7 shard, 8 now ms, 9 retention ms, 10 charge per record,
--   11 drops per call, 12 feed length
-- Reply: {'done', body or nothing} | {'changed', JSON} | {'gone'} | {'not_holder'} |
--   {'no_body'} (a mark of a push whose body is missing: nothing written)
local k = {u = KEYS[1], t = KEYS[2], b = KEYS[3], o = KEYS[4], c = KEYS[5], s = KEYS[6],
  d = KEYS[7], r = KEYS[8], f = KEYS[9]}
local id, change = ARGV[1], ARGV[4]
local cur = redis.call('HGET', k.t, id)
if not cur then
  local done = redis.call('HGET', k.d, id)
  if done then
    return {'changed', done}
  end
  return {'gone'}
end
local old = cjson.decode(cur)
if old.rev ~= tonumber(ARGV[2]) then
  return {'changed', cur}
end
local new = cjson.decode(ARGV[3])
local field
if old.collapse_key then
  field = old.tenant .. '\n' .. old.collapse_key
end
if change == 'mark' then
  if redis.call('GET', KEYS[10]) ~= ARGV[5] or redis.call('HGET', KEYS[11], ARGV[7]) ~= ARGV[6] then
    return {'not_holder'}
  end
  local body = redis.call('HGET', k.b, id)
  if not body then
    return {'no_body'}
  end
  if field and redis.call('HGET', k.c, field) == id then
    redis.call('HDEL', k.c, field)
  end
  redis.call('HSET', k.t, id, ARGV[3])
  return {'done', body}
elseif change == 'unsent' then
  if field and new.state == 'queued' then
    redis.call('HSETNX', k.c, field, id)
  end
  redis.call('HSET', k.t, id, ARGV[3])
  return {'done'}
end
local per_record = tonumber(ARGV[10])
gc(k, old.tenant, tonumber(ARGV[8]), tonumber(ARGV[11]), per_record)
finish(k, id, old, ARGV[3], tonumber(ARGV[8]) + tonumber(ARGV[9]), per_record, tonumber(ARGV[12]))
return {'done'}
