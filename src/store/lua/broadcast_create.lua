-- broadcast_create: a broadcast written once (BroadcastState::create).
-- KEYS: 1 broadcast:<id>, 2 broadcasts
-- ARGV: 1 id, 2 record JSON, 3 body, 4 now ms (the creating pod's clock), 5 expires ms,
--   6 keep until ms, 7 most unexpired broadcasts, 8 the events channel (`broadcast <id>`
--   is published there: every pod looks; the previous release reads it as "poll now")
-- Reply: {'new'} | {'existing', JSON} | {'full', count}
local meta = redis.call('HGET', KEYS[1], 'meta')
if meta then
  return {'existing', meta}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
local active = redis.call('ZCARD', KEYS[2])
if active >= tonumber(ARGV[7]) then
  return {'full', active}
end
redis.call('HSET', KEYS[1], 'meta', ARGV[2], 'body', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('PUBLISH', ARGV[8], 'broadcast ' .. ARGV[1])
return {'new'}
