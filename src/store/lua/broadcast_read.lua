-- broadcast_read: the broadcasts' reads (no writes).
-- find:   KEYS 1 broadcast:<id>, 2 broadcast-progress:<id> -> {meta or '', progress flat}
-- active: KEYS 1 broadcasts, ARGV 2 now ms -> ids of the unexpired, soonest expiry first
-- body:   KEYS 1 broadcast:<id> -> body or ''
-- marks:  KEYS 1 broadcast-marks:<id>:<shard> -> flat terminal, mark
local mode = ARGV[1]
if mode == 'find' then
  local meta = redis.call('HGET', KEYS[1], 'meta')
  if not meta then
    return {'', {}}
  end
  return {meta, redis.call('HGETALL', KEYS[2])}
elseif mode == 'active' then
  return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf')
elseif mode == 'body' then
  return redis.call('HGET', KEYS[1], 'body') or ''
elseif mode == 'marks' then
  return redis.call('HGETALL', KEYS[1])
end
return redis.error_reply('unknown broadcast_read mode ' .. tostring(mode))
