-- directory_read: the directory's read-only calls, selected by ARGV[1].
-- 'scan':     KEYS[1] terminals:<shard>; ARGV[2] cursor, ARGV[3] page size.
--             Reply: {next cursor, {id, json, id, json...}} (HSCAN: an id may repeat)
-- 'versions': KEYS[1] terminals-version, KEYS[2] gen; ARGV[2..] shards.
--             Reply: {generation id or false, {version or false...}}: one atomic read,
--             so a caller knows which generation the versions belong to
-- 'count':    KEYS = terminals:<shard>... Reply: total number of terminals
local op = ARGV[1]
if op == 'scan' then
  return redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
elseif op == 'versions' then
  return {redis.call('HGET', KEYS[2], 'id'), redis.call('HMGET', KEYS[1], unpack(ARGV, 2))}
elseif op == 'count' then
  local total = 0
  for i = 1, #KEYS do
    total = total + redis.call('HLEN', KEYS[i])
  end
  return total
end
return redis.error_reply('directory_read: unknown op ' .. tostring(op))
