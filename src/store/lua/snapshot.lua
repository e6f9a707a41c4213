-- snapshot: one atomic read of generation, live members, lease holders and the
-- placement. Writes only to create a missing generation and to prune expired members.
-- KEYS[1] gen, KEYS[2] members, KEYS[3] member-info, KEYS[4] epochs, KEYS[5] placement,
-- KEYS[6..] lease:<shard> for shards 0..n-1
-- ARGV[1] nonce, ARGV[2..] shard ids aligned with KEYS[6..]
-- Reply: {gen_id, age_ms, {member_json...}, {lease...}, placement, heartbeats} where
-- lease is {} (free) or {owner, epoch}, placement is {} (none) or {version, table_json},
-- and heartbeats is the generation's heartbeat count (see heartbeat.lua). Members are not sorted here: Lua compares strings with the server's
-- locale, so the client sorts by pod id.
-- '' never matches a generation id, so check_gen always answers the current one.
local g, now = check_gen(KEYS[1], '', ARGV[1])
local live_from = int(now)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. live_from)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. live_from)
  for _, pod in ipairs(expired) do
    redis.call('HDEL', KEYS[3], pod)
  end
end
-- One multi-key read each instead of a call per member and per shard: this script runs
-- every poll interval on every pod.
local members = {}
local pods = redis.call('ZRANGEBYSCORE', KEYS[2], live_from, '+inf')
if #pods > 0 then
  for _, info in ipairs(redis.call('HMGET', KEYS[3], unpack(pods))) do
    -- heartbeat writes both keys together; a member without details was tampered with.
    if info then
      members[#members + 1] = info
    end
  end
end
local leases = {}
if #KEYS >= 6 then
  local owners = redis.call('MGET', unpack(KEYS, 6))
  local epochs = redis.call('HMGET', KEYS[4], unpack(ARGV, 2))
  for i, owner in ipairs(owners) do
    if owner then
      leases[i] = {owner, tonumber(epochs[i]) or 0}
    else
      leases[i] = {}
    end
  end
end
local placement = {}
local stored = redis.call('HMGET', KEYS[5], 'version', 'table')
if stored[1] and stored[2] then
  placement = {stored[1], stored[2]}
end
local beats = tonumber(redis.call('HGET', KEYS[1], 'heartbeats')) or 0
return {g[2], g[3], members, leases, placement, beats}
