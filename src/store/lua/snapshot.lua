-- snapshot: one atomic read of generation, live members and lease holders. Writes only
-- to create a missing generation and to prune expired members.
-- KEYS[1] gen, KEYS[2] members, KEYS[3] member-info, KEYS[4] epochs,
-- KEYS[5..] lease:<shard> for shards 0..n-1
-- ARGV[1] nonce, ARGV[2..] shard ids aligned with KEYS[5..]
-- Reply: {gen_id, age_ms, {member_json...}, {lease...}} where lease is {} (free) or
-- {owner, epoch}. Members are not sorted here: Lua compares strings with the server's
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
local members = {}
for _, pod in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], live_from, '+inf')) do
  local info = redis.call('HGET', KEYS[3], pod)
  -- heartbeat writes both keys together; a member without details was tampered with.
  if info then
    members[#members + 1] = info
  end
end
local leases = {}
for i = 5, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if owner then
    leases[#leases + 1] = {owner, tonumber(redis.call('HGET', KEYS[4], ARGV[i - 3])) or 0}
  else
    leases[#leases + 1] = {}
  end
end
return {g[2], g[3], members, leases}
