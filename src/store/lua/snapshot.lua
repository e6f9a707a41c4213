-- snapshot: one atomic read of generation, live members, lease holders and the
-- placement. Writes only to create a missing generation and to prune expired members.
-- KEYS[1] gen, KEYS[2] members, KEYS[3] member-info, KEYS[4] epochs, KEYS[5] placement
-- ARGV[1] nonce, ARGV[2] shard count n, ARGV[3] what every key of the cluster starts
-- with (the leases are ARGV[3] .. 'lease:' .. shard for shards 0..n-1, the pod leases
-- ARGV[3] .. 'pod-lease:' .. pod), ARGV[4] the digest of the view the caller holds
-- ('' for none)
-- Reply: {gen_id, age_ms, heartbeats, digest, view} where view is {} when `digest`
-- equals ARGV[4] (the caller's view is current) and otherwise {{member_json...},
-- {lease...}, placement}: lease is {} (free) or {owner, epoch}, placement {} (none) or
-- {version, table_json}. heartbeats is the generation's heartbeat count (see
-- heartbeat.lua). Members come in this server's string order (Lua compares with the
-- server's locale), so the client sorts them by pod id.
--
-- Why a digest: this script runs every poll interval on every pod, and the view grows
-- with the shard count (1,024 leases are ~40 KB) while it rarely changes. The digest is
-- SHA-1 over the view as read, so "unchanged" is never a guess: no state of its own in
-- Redis to keep, bound or lose. The lease keys are named here, not passed as KEYS, for
-- the same reason; they share the other keys' hash tag, so they are in the same slot.
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
-- One multi-key read each instead of a call per member and per shard.
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
-- The digest's text: members in a fixed order (any order this server keeps), then each
-- lease and the placement as stored.
table.sort(members)
local text = {table.concat(members, '\n'), '\n'}
local n = tonumber(ARGV[2])
local owners, epochs = {}, {}
if n > 0 then
  local names, shards = {}, {}
  for s = 0, n - 1 do
    names[s + 1] = ARGV[3] .. 'lease:' .. s
    shards[s + 1] = s
  end
  -- unpack is limited by the Lua stack (8,000 values): 4,096 shards is below it.
  owners = redis.call('MGET', unpack(names))
  -- Orphans: only leases of owners that are not live members are looked at (none while
  -- the cluster is steady), each owner's pod lease once.
  local live, leased = {}, {}
  for _, pod in ipairs(pods) do
    live[pod] = true
  end
  for i, owner in ipairs(owners) do
    if owner and not live[owner] then
      if leased[owner] == nil then
        leased[owner] = redis.call('EXISTS', ARGV[3] .. 'pod-lease:' .. owner) == 1
      end
      if not leased[owner] and redis.call('PTTL', names[i]) == -1 then
        redis.call('DEL', names[i])
        owners[i] = false
      end
    end
  end
  epochs = redis.call('HMGET', KEYS[4], unpack(shards))
  -- Pieces, not one string per shard: Lua interns every string it makes.
  local t = #text
  for i, owner in ipairs(owners) do
    if owner then
      -- Pod ids have no spaces, epochs are digits: no two leases read alike.
      text[t + 1], text[t + 2], text[t + 3], text[t + 4] = owner, ' ', epochs[i] or '', '\n'
      t = t + 4
    else
      text[t + 1] = '\n'
      t = t + 1
    end
  end
end
local placement = {}
local stored = redis.call('HMGET', KEYS[5], 'version', 'table')
if stored[1] and stored[2] then
  placement = {stored[1], stored[2]}
  text[#text + 1] = stored[1] .. ' ' .. stored[2]
end
local beats = tonumber(redis.call('HGET', KEYS[1], 'heartbeats')) or 0
local digest = redis.sha1hex(table.concat(text))
if digest == ARGV[4] then
  return {g[2], g[3], beats, digest, {}}
end
-- Changed: the view itself, built only now (most polls end above).
local leases = {}
for i, owner in ipairs(owners) do
  if owner then
    leases[i] = {owner, tonumber(epochs[i]) or 0}
  else
    leases[i] = {}
  end
end
return {g[2], g[3], beats, digest, {members, leases, placement}}
