-- queue_read: what the queue holds, without writing (QueueState::find, pending,
-- waiting, feed). ARGV[1] is the operation:
--   find:    KEYS 1 gen, 2 queue:<t>, 3 done:<tenant>, 4 drops:<tenant>;
--            ARGV 2 id, 3 now ms -> {generation or '', record JSON or ''}
--   pending: KEYS 1 queue:<t>, 2 order:<t> -> {record JSON...} in acceptance order
--   waiting: KEYS waiting:<shard>... -> per key {terminal, count, terminal, count, ...}
--   feed:    KEYS 1 gen, 2 feed:<tenant>; ARGV 2 after ('' for the oldest), 3 limit
--            -> {generation or '', gap 0/1, {cursor, record JSON}...}
local op = ARGV[1]
if op == 'find' then
  local gen = redis.call('HGET', KEYS[1], 'id') or ''
  local json = redis.call('HGET', KEYS[2], ARGV[2])
  if not json then
    local drop = redis.call('ZSCORE', KEYS[4], ARGV[2])
    if drop and tonumber(drop) > tonumber(ARGV[3]) then
      json = redis.call('HGET', KEYS[3], ARGV[2])
    end
  end
  return {gen, json or ''}
elseif op == 'pending' then
  local out = {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local json = redis.call('HGET', KEYS[1], id)
    if json then
      out[#out + 1] = json
    end
  end
  return out
elseif op == 'waiting' then
  local out = {}
  for i, key in ipairs(KEYS) do
    out[i] = redis.call('HGETALL', key)
  end
  return out
elseif op == 'feed' then
  local gen = redis.call('HGET', KEYS[1], 'id') or ''
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return {gen, 0}
  end
  local start, gap = '-', 0
  if ARGV[2] ~= '' then
    start = '(' .. ARGV[2]
    local info = redis.call('XINFO', 'STREAM', KEYS[2])
    for i = 1, #info, 2 do
      if info[i] == 'max-deleted-entry-id' then
        local dm, ds = string.match(info[i + 1], '^(%d+)-(%d+)$')
        local am, as = string.match(ARGV[2], '^(%d+)-(%d+)$')
        dm, ds, am, as = tonumber(dm), tonumber(ds), tonumber(am), tonumber(as)
        if am < dm or (am == dm and as < ds) then
          gap = 1
        end
      end
    end
  end
  local out = {gen, gap}
  for _, entry in ipairs(redis.call('XRANGE', KEYS[2], start, '+', 'COUNT', ARGV[3])) do
    out[#out + 1] = {entry[1], entry[2][2]}
  end
  return out
end
return redis.error_reply('unknown queue_read operation')
