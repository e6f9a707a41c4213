-- directory_restore: write one shard's directory back from its owner's memory after the
-- store lost its data. Writes the whole shard, or nothing unless all of these hold:
--   1. ARGV[1] is the current generation (else {'gen', id, age_ms}, as every write);
--   2. the directory was read in another generation (ARGV[5] differs from it): an empty
--      shard in the generation it was read in is an operator's removal, not a loss;
--   3. the caller is the shard's current epoch holder: the lease names ARGV[3] and the
--      shard's last epoch is ARGV[4] (compared as decimal strings, as both are written);
--   4. the shard's directory is untouched in this generation: no terminals hash and no
--      version field (an import, a removal or another write-back came first).
-- KEYS[1] gen, KEYS[2] epochs, KEYS[3] lease:<shard>, KEYS[4] terminals:<shard>,
-- KEYS[5] terminals-version, KEYS[6] terminals-restored, KEYS[7] terminal-labels:<shard>
-- ARGV[1] caller generation, ARGV[2] nonce, ARGV[3] pod id, ARGV[4] epoch,
-- ARGV[5] generation the directory was read in, ARGV[6] shard,
-- then triples (terminal id, JSON entry, labels text or '')
-- Reply: {'gen', id, age_ms} | {'ok', outcome} where outcome is
--   {'written', version} | {'same_generation'} | {'not_holder', owner|false, epoch|false}
--   | {'present'}
local g, now = check_gen(KEYS[1], ARGV[1], ARGV[2])
if g then
  return g
end
local pod, epoch, read_in, shard = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if read_in == ARGV[1] then
  return {'ok', {'same_generation'}}
end
local owner = redis.call('GET', KEYS[3])
local last = redis.call('HGET', KEYS[2], shard)
if owner ~= pod or last ~= epoch then
  return {'ok', {'not_holder', owner, last}}
end
-- HLEN and HGET rather than EXISTS and HEXISTS: the same commands as the other scripts,
-- so the ACL of k8s/overlays/prod/redis-users.acl needs no change.
if redis.call('HLEN', KEYS[4]) > 0 or redis.call('HGET', KEYS[5], shard) then
  return {'ok', {'present'}}
end
local n = 0
for j = 7, #ARGV, 3 do
  redis.call('HSET', KEYS[4], ARGV[j], ARGV[j + 1])
  if ARGV[j + 2] ~= '' then
    redis.call('HSET', KEYS[7], ARGV[j], ARGV[j + 2])
  end
  n = n + 1
end
-- The version field is absent (checked above), so max(previous + 1, now) is `now`.
local version = int(now)
redis.call('HSET', KEYS[5], shard, version)
redis.call('HSET', KEYS[6], shard, string.format(
  '{"pod":%s,"epoch":%s,"generation":%s,"read_in":%s,"version":%s,"terminals":%d}',
  cjson.encode(pod), epoch, cjson.encode(ARGV[1]), cjson.encode(read_in), version, n))
-- `now` itself, not `version` (its decimal string): a Lua number is an integer reply.
return {'ok', {'written', now}}
