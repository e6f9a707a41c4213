-- acquire: try to take a batch of shard leases, each above the caller's floor.
-- KEYS[1] gen, KEYS[2] epochs, KEYS[3] members, KEYS[4] the caller's pod-lease,
-- KEYS[5..4+n] lease:<shard> (one per shard, in call order), KEYS[5+n..4+2n]
-- release-note:<shard> (same order)
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] ttl ms, ARGV[5]
-- upkeep ('pod' or 'lease', see lib.lua), ARGV[6] the cluster's shard count, ARGV[7]
-- what every key of the cluster starts with (the leases are ARGV[7] .. 'lease:' ..
-- shard, the pod leases ARGV[7] .. 'pod-lease:' .. pod), ARGV[8..7+n] shard ids (the
-- epochs hash fields), aligned with the leases, ARGV[8+n..7+2n] floors: the highest
-- epoch the caller knows for each shard (0: none)
-- Reply: {'gen', id, age_ms} | {'ok', outcome...} where outcome is
--   {'acquired', epoch, note} | {'mine', epoch} | {'held', owner, epoch}
-- `note`: the member record (JSON) the last drained release left (release.lua), or ''
-- once it expired or if there was none: the pod to ask before dialing.
-- Epoch rule: max(last + 1, now_ms, floor + 1). `last + 1` makes epochs strictly
-- increase while Redis keeps the epochs hash; `now_ms` keeps them increasing after Redis
-- lost it (a restart takes longer than one millisecond per acquisition made before it);
-- `floor + 1` keeps them above what the caller knows when Redis lost its last writes
-- and its clock is behind (a failover to a replica that had not received them).
-- A lease the caller already holds is extended ('mine'); its epoch is bumped by the same
-- rule, owner-checked, only when the floor is above the stored epoch: a terminal has
-- seen a newer epoch than this Redis remembers. A lease whose key is an orphan (lib.lua),
-- the caller's own included, is taken over as if free.
-- Floors stay below 2^53 (the caller's bound), so the Lua numbers are exact.
local g, now = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, ttl = ARGV[3], ARGV[4]
local function live()
  return live_member(KEYS[3], pod, now)
end
local px = upkeep(ARGV[5], KEYS[4], pod, ttl, ARGV[7] .. 'lease:', tonumber(ARGV[6]), live)
local out = {'ok'}
local n = (#KEYS - 4) / 2
local function next_epoch(last, floor)
  return math.max(last + 1, now, floor + 1)
end
-- A held lease of another pod: its owner is live, or its key is not an orphan.
local function held(name, owner)
  return live_member(KEYS[3], owner, now) or not orphan(name, owner, ARGV[7] .. 'pod-lease:')
end
for i = 5, 4 + n do
  local shard = ARGV[i + 3]
  local floor = tonumber(ARGV[i + 3 + n]) or 0
  local owner = redis.call('GET', KEYS[i])
  local last = tonumber(redis.call('HGET', KEYS[2], shard)) or 0
  if owner == pod and not keep_own(KEYS[i], px, live) then
    owner = false
  end
  if (not owner) or (owner ~= pod and not held(KEYS[i], owner)) then
    local epoch = next_epoch(last, floor)
    if px then
      redis.call('SET', KEYS[i], pod, 'PX', px)
    else
      redis.call('SET', KEYS[i], pod)
    end
    redis.call('HSET', KEYS[2], shard, int(epoch))
    out[#out + 1] = {'acquired', epoch, redis.call('GET', KEYS[i + n]) or ''}
  elseif owner == pod then
    -- An earlier acquire whose answer was lost, or a re-claim: extended by keep_own.
    local epoch = last
    if floor > last then
      epoch = next_epoch(last, floor)
      redis.call('HSET', KEYS[2], shard, int(epoch))
    end
    out[#out + 1] = {'mine', epoch}
  else
    out[#out + 1] = {'held', owner, last}
  end
end
return out
